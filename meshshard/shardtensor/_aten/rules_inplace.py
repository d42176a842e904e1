"""In-place pointwise ops (``add_``, ``div_``, ``mul_``, ...) on a ShardTensor ``self``.

The caller of an in-place op keeps ``self`` (torch returns the argument, not what dispatch
returns), so ``self`` itself must hold the result. The out-of-place pointwise rule may change
``self``'s layout: a Partial ``self`` divided by a Replicate tensor is summed first; a
Replicate ``self`` times a sharded tensor keeps only this rank's rows. torch's own backward
formulas do this on fresh tensors (``layer_norm_double_backward``: ``sum(...).div_(N)``).
The rule runs the plan on the converted local and points ``self`` at the result and its
layout; the global value is the one the op defines. Linear ops keep a Partial ``self`` Partial
(``rules._LINEAR_*``), so nothing moves for those.

Other views of ``self``'s old local piece do not see a layout change (they keep their own
layout, and an all-reduced or narrowed piece is a new buffer); with no layout change the op
runs on the local piece in place, as torch's does, so views see it.
"""

from __future__ import annotations

import torch

from meshshard.errors import LayoutError
from meshshard.shardtensor._aten.registry import POINTWISE_INPLACE, register_rule
from meshshard.shardtensor._aten.rules import (
    _execute,
    _key_of,
    _pointwise,
    same_layout,
)
from meshshard.shardtensor._aten.tensor import ShardTensor

_PLANS: dict = {}


def inplace_pointwise(func, args, kwargs):
    self = args[0]
    if type(self) is not ShardTensor:
        msg = (f"{func}: in place on a plain tensor with a ShardTensor operand; the result "
               "is sharded (use the out-of-place op)")
        raise LayoutError(msg)
    key = None
    if type(self._local) is torch.Tensor:  # eager: plans cached per layout, as dispatch does
        try:
            key = (func, _key_of(args), _key_of(tuple(kwargs.items())))
            plan = _PLANS.get(key)
        except TypeError:
            key = plan = None
    else:
        plan = None
    if plan is None:
        plan = _pointwise(func, args, kwargs)
        if key is not None:
            if len(_PLANS) > 4096:
                _PLANS.clear()
            _PLANS[key] = plan
    out = _execute(func, args, kwargs, plan)
    if out._local is not self._local or not same_layout(out._spec, self._spec):
        self._local = out._local
        self._spec = out._spec
        for name in [k for k in self.__dict__ if k.startswith("_sz")]:  # size carriers
            del self.__dict__[name]
    return self


register_rule(POINTWISE_INPLACE, direct=True, extends=_pointwise)(inplace_pointwise)
