"""Fast paths of the generic pointwise rule, and the small layout helpers they share with it.

A pointwise op whose tensor operands are ShardTensors of one and the same layout (no Partial),
plus Python numbers or plain tensors that do not reach a sharded dim, needs no cutting,
alignment or reduction: it runs on the local pieces and keeps the layout. The decision for the
plain operands is remembered on the input spec (:meth:`ShardSpec.derived`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.tensor import Replicate, Shard

from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._layout import wrap, wrap_outputs
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import _name
from meshshard.shardtensor.spec import ShardSpec, mesh_group


def _broadcast_shapes(func, shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """``torch.broadcast_shapes`` on concrete sizes, in plain Python (the torch one goes through
    symbolic-shape guards, ~0.5 ms a call)."""
    nd = max(len(s) for s in shapes)
    out = [1] * nd
    for s in shapes:
        off = nd - len(s)
        for k, v in enumerate(s):
            v = int(v)
            cur = out[off + k]
            if v == cur or v == 1:
                continue
            if cur == 1:
                out[off + k] = v
            else:
                msg = (
                    f"{_name(func)}: shapes {[tuple(x) for x in shapes]} cannot be broadcast "
                    f"together (dim {off + k - nd}: {cur} vs {v})"
                )
                raise RuntimeError(msg)
    return tuple(out)


_MISS = object()
_SCALARS = (int, float, bool, complex)


def _same_layout(a: ShardSpec, b: ShardSpec) -> bool:
    return a is b or (
        a.mesh is b.mesh
        and a.shape == b.shape
        and a.sizes == b.sizes
        and a.placements == b.placements
    )


def _is_inplace_name(name: str) -> bool:
    return (name.endswith("_") and not name.endswith("__")) or (
        name.startswith("__i") and name != "__invert__"
    )


def _same_layout_pointwise(func, args: tuple) -> Any:
    """Fast path of :func:`pointwise_apply`: every tensor operand is a ShardTensor of one and
    the same layout (mesh, placements, sizes, global shape) without Partial, the rest are Python
    numbers. Then nothing is cut, aligned, reduced or broadcast across shards: the op runs on the
    local pieces and the result keeps that layout. Anything else returns ``_MISS`` and takes the
    general rule."""
    spec = None
    plain = None
    for a in args:
        if isinstance(a, ShardTensor):
            if spec is None:
                spec = a._spec
            elif not _same_layout(a._spec, spec):
                return _MISS
        elif isinstance(a, torch.Tensor):
            plain = (*plain, tuple(a.shape)) if plain else (tuple(a.shape),)
        elif not isinstance(a, _SCALARS):
            return _MISS
    if spec is None or spec.has_partial():
        return _MISS
    name = getattr(func, "__name__", "")
    inplace = _is_inplace_name(name) and isinstance(args[0], ShardTensor)
    if plain:
        groups = spec.derived(
            ("pointwise-plain", plain), lambda: _plain_operand_groups(spec, plain)
        )
        if groups is False:
            return _MISS
        local_args = [
            a._local if isinstance(a, ShardTensor)
            else C.grad_all_reduce(a, groups) if isinstance(a, torch.Tensor) and groups
            else a
            for a in args
        ]
        out = func(*local_args)
    else:
        out = func(*[a._local if isinstance(a, ShardTensor) else a for a in args])
    if inplace:
        args[0].__dict__.pop("_reduced_cache", None)
        return args[0]
    if isinstance(out, torch.Tensor):
        return wrap(out, _checked(spec, out))
    return _wrap_outputs(out, spec)


def _plain_operand_groups(spec: ShardSpec, plain: tuple) -> Any:
    """For :func:`_same_layout_pointwise` with plain (replicated) tensors of shapes ``plain``
    beside ShardTensors of ``spec`` (no Partial): ``False`` unless the plain tensors broadcast
    into the global shape without reaching a sharded dim (absent or of size 1 there: nothing to
    cut); then the groups their gradients are summed over, as :func:`replicated_local`
    decides for that case."""
    nd = len(spec.shape)
    try:
        if _broadcast_shapes("pointwise", (tuple(spec.shape), *plain)) != tuple(spec.shape):
            return False
    except RuntimeError:  # the general rule reports it
        return False
    for p in spec.placements:
        if isinstance(p, Shard):
            for shp in plain:
                d = p.dim - (nd - len(shp))
                if d >= 0 and shp[d] != 1:
                    return False
    return [mesh_group(spec.mesh, i) for i, p in enumerate(spec.placements)
            if not isinstance(p, Replicate)]


def _checked(spec: ShardSpec, o: torch.Tensor) -> ShardSpec:
    """The output spec, after checking the local result has the shape it promises."""
    if o.shape != spec.local_shape():
        msg = (
            f"internal: local result shape {tuple(o.shape)} does not match the layout "
            f"{spec.describe()}"
        )
        raise RuntimeError(msg)
    return spec


def _wrap_outputs(out: Any, spec: ShardSpec) -> Any:
    return wrap_outputs(out, lambda o: _checked(spec, o))
