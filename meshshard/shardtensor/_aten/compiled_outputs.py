"""Gradients into a compiled graph in the layout it traced.

A compiled graph's backward takes each output's gradient in the layout it traced, but the
layout's per-rank sizes are not in what torch hands ``__coerce_same_metadata_as_tangent__``
(only the mesh and placements, so that new sizes reuse the graph). An eager op may give the
output a gradient in another layout: ``compiled(x).sum()``'s backward expands a Replicate
scalar, which failed ("we guessed its metadata incorrectly"). Where the output is used, its
layout is known: ``ShardTensor.__torch_function__`` (eager only) passes every compiled output
among the arguments through :class:`_KeepLayout`, whose backward returns the gradient in the
output's own layout. ``docs/design/core.md``, "Gradients into a compiled graph in another
layout".
"""

from __future__ import annotations

from typing import Any

import torch

from meshshard.shardtensor._aten._torch_private import skip_dynamo_frame
from meshshard.shardtensor._aten.tensor import LATE, ShardTensor, _late

__all__ = ["in_layout", "keep_compiled_layouts"]


def _from_compiled(a: Any) -> bool:
    return type(a) is ShardTensor and a.grad_fn is not None and \
        type(a.grad_fn).__name__ == "CompiledFunctionBackward"


def keep_compiled_layouts(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with each output of a compiled graph passed through
    :class:`_KeepLayout` (``func``'s own call of it excepted)."""
    if getattr(func, "__self__", None) is _KeepLayout:
        return args, kwargs
    if not any(type(a) is ShardTensor and "_from_graph" in a.__dict__
               for a in (*args, *kwargs.values())):  # fmt: skip
        return args, kwargs  # (the cheap test first: no wrapper of this call left a graph)
    with torch._C.DisableTorchFunction():  # (reading grad_fn is a torch function)
        pos = [_from_compiled(a) for a in args]
        names = [k for k, v in kwargs.items() if _from_compiled(v)]
    if not any(pos) and not names:
        return args, kwargs
    args = tuple(_KeepLayout.apply(a) if hit else a for a, hit in zip(args, pos))
    kwargs = {k: _KeepLayout.apply(v) if k in names else v for k, v in kwargs.items()}
    return args, kwargs


# an eager fallback region inside a compiled function calls these from ``__torch_function__``;
# dynamo would compile each as a frame of its own and break at ``grad_fn``
skip_dynamo_frame(keep_compiled_layouts)
skip_dynamo_frame(_from_compiled)


class _KeepLayout(torch.autograd.Function):
    """Identity on a ShardTensor; backward: the gradient in the input's own layout (placements
    and per-rank sizes), redistributed if it came in another (differentiable, collective)."""

    @staticmethod
    def forward(x: ShardTensor) -> ShardTensor:
        return ShardTensor(x._local.view_as(x._local), x._spec)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.spec = inputs[0]._spec

    @staticmethod
    def backward(ctx, g):
        return in_layout(g, ctx.spec)


def in_layout(g: Any, spec: Any) -> Any:
    """The ShardTensor ``g`` in the layout ``spec`` (placements and per-rank sizes),
    redistributed if it is in another (differentiable, collective); anything else as given."""
    if type(g) is not ShardTensor or (g._spec.placements, g._spec.sizes) == \
            (spec.placements, spec.sizes):
        return g
    return _late("redistribute")(g, spec.placements, list(spec.sizes))


for _fn in (_KeepLayout.forward, _KeepLayout.setup_context, _KeepLayout.backward):
    skip_dynamo_frame(_fn)


LATE["keep_compiled_layouts"] = keep_compiled_layouts
