"""Python values of a ShardTensor (``item``, ``float``, ``int``, ``bool``, ``tolist``,
``numpy``): a one-element tensor converts (a Partial or sharded one is reduced or gathered
first, as ``rules._item`` does); a sharded tensor of more elements holds different values on
each rank, so the conversion is refused with an error that says so and what to call instead
(torch's own message only counts the elements). Function-level rules: they run before any
aten op.
"""

from __future__ import annotations

import torch

from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import SHARDED, ShardTensor


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
