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

from meshshard.errors import LayoutError
from meshshard.shardtensor._aten import rules as _base
from meshshard.shardtensor._aten.rules import _DIRECT, _execute, _pointwise, same_layout
from meshshard.shardtensor._aten.tensor import ShardTensor


def inplace_pointwise(func, args, kwargs):
    self = args[0]
    if type(self) is not ShardTensor:
        msg = (f"{func}: in place on a plain tensor with a ShardTensor operand; the result "
               "is sharded (use the out-of-place op)")
        raise LayoutError(msg)
    plan = _pointwise(func, args, kwargs)
    out = _execute(func, args, kwargs, plan)
    if out._local is not self._local or not same_layout(out._spec, self._spec):
        self._local = out._local
        self._spec = out._spec
        for name in [k for k in self.__dict__ if k.startswith("_sz")]:  # size carriers
            del self.__dict__[name]
    return self


_DIRECT.add(inplace_pointwise)
_base._POINTWISE_INPLACE[0] = inplace_pointwise
