"""The generic sharding rules, for functions with no handler of their own: all-Replicate inputs
(compute locally) and elementwise functions with broadcasting (shard layouts must agree)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.utils._pytree import tree_flatten, tree_unflatten

from meshshard.shardtensor._layout import (
    LayoutError,
    align_sizes,
    check_same_mesh,
    reduce_partials,
    replicated_local,
    wrap_outputs,
)
from meshshard.shardtensor._pointwise_fast import (
    _MISS,
    _broadcast_shapes,
    _checked,
    _same_layout_pointwise,
)
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import _name
from meshshard.shardtensor.spec import ShardSpec, intern_spec

__all__ = ["pointwise_apply", "replicated_apply"]


def replicated_apply(func, args, kwargs):
    """Every ShardTensor input is Replicate on every mesh dim: compute locally, result
    Replicate (every rank computes the same values)."""
    if not kwargs and not any(isinstance(a, (list, tuple, dict)) for a in args):
        flat, tspec = args, None
    else:
        flat, tspec = tree_flatten((args, kwargs))
    sts = [t for t in flat if isinstance(t, ShardTensor)]
    mesh = check_same_mesh(sts)
    loc = [t._local if isinstance(t, ShardTensor) else t for t in flat]
    if tspec is None:
        out = func(*loc)
    else:
        a, k = tree_unflatten(loc, tspec)
        out = func(*a, **k)
    rep = tuple(Replicate() for _ in range(mesh.ndim))
    none = tuple(None for _ in range(mesh.ndim))
    return wrap_outputs(out, lambda o: ShardSpec(mesh, rep, none, o.shape))


_LINEAR_PARTIAL_FUNCS = {
    "add",
    "__add__",
    "__radd__",
    "add_",
    "__iadd__",
    "sub",
    "__sub__",
    "__rsub__",
    "sub_",
    "__isub__",
    "neg",
    "__neg__",
    "mul",
    "__mul__",
    "__rmul__",
    "mul_",
    "__imul__",
    "div",
    "__truediv__",
    "div_",
    "__itruediv__",
    "clone",
    "positive",
}


def _partial_ok(func, tensors, mesh_dim: int, n_scalars: int = 0) -> bool:
    """Can Partial on ``mesh_dim`` pass through this pointwise op unreduced?"""
    name = getattr(func, "__name__", "")
    if name not in _LINEAR_PARTIAL_FUNCS:
        return False
    kinds = []
    for t in tensors:
        p = t._spec.placements[mesh_dim] if isinstance(t, ShardTensor) else Replicate()
        kinds.append(p)
    partial = [p for p in kinds if isinstance(p, Partial)]
    if any(isinstance(p, Shard) for p in kinds):
        return False
    if any(p.reduce_op != "sum" for p in partial):
        return False
    if name in {"add", "__add__", "__radd__", "add_", "__iadd__", "sub", "__sub__", "__rsub__",
                "sub_", "__isub__"}:
        # every operand partial; a number added to a partial would be added once per rank
        return len(partial) == len(kinds) and n_scalars == 0
    if name in {"mul", "__mul__", "__rmul__", "mul_", "__imul__"}:
        return len(partial) == 1
    if name in {"div", "__truediv__", "div_", "__itruediv__"}:
        return len(partial) == 1 and isinstance(kinds[0], Partial)
    return True


def pointwise_apply(func, args, kwargs):
    """Elementwise functions with broadcasting: shard layouts must agree (after broadcasting
    alignment); replicated operands are cut to the local rows where they have the full size;
    Partial inputs pass through linear ops and are reduced before anything else."""
    simple = not kwargs and not any(isinstance(a, (list, tuple, dict)) for a in args)
    if simple:
        out = _same_layout_pointwise(func, args)
        if out is not _MISS:
            return out
        flat, tspec = list(args), None
    else:
        flat, tspec = tree_flatten((args, kwargs))
    tensor_pos = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
    sts = [flat[i] for i in tensor_pos if isinstance(flat[i], ShardTensor)]
    mesh = check_same_mesh(sts)
    tensors = [flat[i] for i in tensor_pos]
    inplace_target = None
    name = getattr(func, "__name__", "")
    if (name.endswith("_") and not name.endswith("__")) or (
        name.startswith("__i") and name != "__invert__"  # ~x is not in-place
    ):
        if args and isinstance(args[0], ShardTensor):
            inplace_target = args[0]
    # reduce Partials that cannot pass through
    n_scalars = sum(isinstance(v, (int, float, complex)) and not isinstance(v, bool) for v in args)
    for i in range(mesh.ndim):
        has_partial = any(
            isinstance(t, ShardTensor) and isinstance(t._spec.placements[i], Partial)
            for t in tensors
        )
        if has_partial and not _partial_ok(func, tensors, i, n_scalars):
            if inplace_target is not None and isinstance(
                inplace_target._spec.placements[i], Partial
            ):
                msg = (
                    f"in-place {name} on a Partial ShardTensor would need a reduction first; "
                    "call .redistribute([Replicate()]) and use the out-of-place op"
                )
                raise LayoutError(msg)
            for j in tensor_pos:
                if isinstance(flat[j], ShardTensor):
                    flat[j] = reduce_partials(flat[j], [i])
    tensors = [flat[i] for i in tensor_pos]
    shapes = [t._spec.shape if isinstance(t, ShardTensor) else t.shape for t in tensors]
    out_shape = shapes[0] if all(sh == shapes[0] for sh in shapes) else _broadcast_shapes(
        func, shapes
    )
    nd = len(out_shape)
    # same sharded dim, different sizes: move the later operands' rows to the first's layout
    for j in tensor_pos:
        if isinstance(flat[j], ShardTensor):
            flat[j] = align_sizes(flat[j], [flat[k] for k in tensor_pos], nd)
    tensors = [flat[i] for i in tensor_pos]
    placements: list = []
    sizes: list = []
    for i in range(mesh.ndim):
        shard_dim, shard_sizes, partial = None, None, None
        for t in tensors:
            if not isinstance(t, ShardTensor):
                continue
            p = t._spec.placements[i]
            if isinstance(p, Shard):
                d = p.dim + nd - t._spec.ndim
                if t._spec.shape[p.dim] != out_shape[d]:
                    msg = (
                        f"{_name(func)}: a tensor sharded along dim {p.dim} of global size "
                        f"{t._spec.shape[p.dim]} is broadcast to {out_shape[d]}; replicate it"
                    )
                    raise LayoutError(msg)
                if shard_dim is None:
                    shard_dim, shard_sizes = d, t._spec.sizes[i]
                elif shard_dim != d or shard_sizes != t._spec.sizes[i]:
                    msg = (
                        f"{_name(func)}: operands are sharded differently on mesh dim {i} "
                        f"(dim {shard_dim} sizes {list(shard_sizes)} vs dim {d} sizes "
                        f"{list(t._spec.sizes[i])}); redistribute one first, e.g. "
                        "b = b.redistribute(a.placements, sizes=a.sharding_sizes())"
                    )
                    raise LayoutError(msg)
            elif isinstance(p, Partial):
                partial = p
        if shard_dim is not None:
            placements.append(Shard(shard_dim))
            sizes.append(shard_sizes)
        elif partial is not None:
            placements.append(partial)
            sizes.append(None)
        else:
            placements.append(Replicate())
            sizes.append(None)
    spec_out = intern_spec(ShardSpec(mesh, tuple(placements), tuple(sizes), torch.Size(out_shape)))
    local_flat = list(flat)
    for j in tensor_pos:
        t = flat[j]
        if isinstance(t, ShardTensor):
            tp = t._spec.placements
            need = any(
                isinstance(tp[i], Replicate) and not isinstance(placements[i], Replicate)
                for i in range(mesh.ndim)
            )
            if not need:
                local_flat[j] = t._local
                continue
            # replicated on some mesh dims where the output is not
            aligned = {}
            for i, p in enumerate(placements):
                if isinstance(p, Shard):
                    d = p.dim - (nd - t._spec.ndim)
                    if d >= 0:
                        aligned[i] = d
            sub = ShardSpec(
                mesh,
                tuple(
                    placements[i] if isinstance(tp[i], Replicate) else Replicate()
                    for i in range(mesh.ndim)
                ),
                tuple(
                    sizes[i] if isinstance(tp[i], Replicate) else None for i in range(mesh.ndim)
                ),
                spec_out.shape,
            )
            local_flat[j] = replicated_local(t, sub, aligned)
        else:
            aligned = {}
            for i, p in enumerate(placements):
                if isinstance(p, Shard):
                    d = p.dim - (nd - t.ndim)
                    if d >= 0:
                        aligned[i] = d
            local_flat[j] = replicated_local(t, spec_out, aligned)
    if simple:
        out = func(*local_flat)
    else:
        a, k = tree_unflatten(local_flat, tspec)
        out = func(*a, **k)
    if inplace_target is not None:
        inplace_target.__dict__.pop("_reduced_cache", None)
        if inplace_target._spec.placements != spec_out.placements or tuple(
            inplace_target._spec.shape
        ) != tuple(spec_out.shape):
            msg = (
                f"in-place {name} would change the layout of its target "
                f"({inplace_target._spec.describe()} -> {spec_out.describe()}); use the "
                "out-of-place op"
            )
            raise LayoutError(msg)
        return inplace_target
    return wrap_outputs(out, lambda o: _checked(spec_out, o))
