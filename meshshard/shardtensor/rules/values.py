"""Python values of a ShardTensor (``item``, ``float``, ``int``, ``bool``, ``tolist``,
``numpy``): a one-element tensor converts (a Partial or sharded one is reduced or gathered
first, as the ``_local_scalar_dense`` rule here does); a sharded tensor of more elements holds
different values on each rank, so the conversion is refused with an error that says so and
what to call instead (torch's own message only counts the elements). Function-level rules:
they run before any aten op. Also ``is_same_size`` (global shapes).
"""

from __future__ import annotations

import torch

from meshshard.shardtensor._aten.dispatch import to_replicate_local
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import SHARDED, ShardTensor

aten = torch.ops.aten


def _refuse_sharded(name: str, one_element_ok: bool):
    def check(x, *args, **kwargs):
        if type(x) is ShardTensor and any(isinstance(p, SHARDED) for p in x._spec.placements) \
                and not (one_element_ok and x.numel() == 1):
            msg = (f"{name} of a ShardTensor of {x.numel()} elements sharded {x._spec}: its "
                   "values differ per rank; call .full_tensor() (collective) first")
            raise ValueError(msg)
        return NotImplemented

    return check


for _f, _ok in ((torch.Tensor.item, True), (torch.Tensor.__float__, True),
                (torch.Tensor.__int__, True), (torch.Tensor.__bool__, True),
                (torch.Tensor.tolist, False), (torch.Tensor.numpy, False)):
    register_rule(_f)(_refuse_sharded(f"{_f.__name__}()", _ok))


@register_rule(aten._local_scalar_dense.default, direct=True)
def _item(func, args, kwargs):
    x = args[0]
    return func(to_replicate_local(x._local, x._spec))


@register_rule(aten.is_same_size.default, direct=True)
def _same_size(func, args, kwargs):
    return tuple(args[0].shape) == tuple(args[1].shape)
