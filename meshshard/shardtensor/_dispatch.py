"""Routing torch functions on ShardTensors to sharding rules, and the shared rule helpers."""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._pointwise_fast import (
    _MISS,
    _broadcast_shapes,
    _checked,
    _same_layout_pointwise,
    wrap,
)
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import _name, get_handler, on_registry_change
from meshshard.shardtensor.spec import ShardSpec, intern_spec, mesh_group

log = logging.getLogger(__name__)

__all__ = [
    "LayoutError",
    "NoShardingRuleError",
    "allow_gather_fallback",
    "dispatch_function",
]


class NoShardingRuleError(NotImplementedError):
    """A torch function has no sharding rule for ShardTensor arguments."""


class LayoutError(ValueError):
    """Operands are laid out incompatibly (different meshes or different shard sizes)."""


_state = threading.local()
_WARNED: set = set()


@contextlib.contextmanager
def allow_gather_fallback(enabled: bool = True):
    """Opt in: ops without a sharding rule gather their ShardTensor inputs, compute on the full
    tensors, and re-shard the result (warning once per op). Off by default, because it silently
    costs a full gather per call."""
    prev = getattr(_state, "fallback", False)
    _state.fallback = enabled
    try:
        yield
    finally:
        _state.fallback = prev


# ---------------------------------------------------------------------------- entry point
_GETTERS_LOCAL = {"grad", "requires_grad", "is_leaf", "grad_fn", "data", "_base"}


def dispatch_function(func: Callable, types, args: tuple, kwargs: dict) -> Any:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        attr = getattr(owner, "__name__", "")
        if attr == "data":
            st = args[0]
            return ShardTensor(st._local.data, st._spec)
        if attr in _GETTERS_LOCAL:
            return getattr(args[0]._local, attr)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    if func in _PASSTHROUGH:
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    handler = get_handler(func)
    if handler is not None:
        return handler(*args, **kwargs)
    route_key = None
    if not kwargs:
        route_key = _route_key(func, args)
        pointwise = _ROUTES.get(route_key) if route_key is not None else None
        if pointwise is not None:
            # classified before, with no aten-level handler: skip the classification
            if all(t._spec.is_replicated() for t in args if isinstance(t, ShardTensor)):
                return replicated_apply(func, args, kwargs)
            if pointwise:
                return pointwise_apply(func, args, kwargs)
    # classify by the aten ops the function decomposes into (cached)
    ops, single_call = _trace(func, args, kwargs)
    if single_call is not None:
        aten_handler = get_handler(single_call[0])
        if aten_handler is not None:
            return aten_handler(*single_call[1], **single_call[2])
    if not kwargs and not any(isinstance(a, (list, tuple, dict)) for a in args):
        flat = args
    else:
        flat, _ = tree_flatten((args, kwargs))
    sts = [t for t in flat if isinstance(t, ShardTensor)]
    pointwise = ops is not None and bool(ops) and all(_is_pointwise(op) for op in ops)
    if route_key is not None and ops is not None and single_call is None:
        _ROUTES[route_key] = pointwise
    if sts and all(t._spec.is_replicated() for t in sts):
        return replicated_apply(func, args, kwargs)
    if pointwise:
        return pointwise_apply(func, args, kwargs)
    if getattr(_state, "fallback", False):
        return _gather_fallback(func, args, kwargs, ops)
    err = getattr(_state, "last_trace_error", None)
    if ops is None and isinstance(err, (RuntimeError, ValueError, IndexError, TypeError)):
        msg = f"{_name(func)} fails on the global shapes of its ShardTensor arguments: {err}"
        raise type(err)(msg) from err
    aten = ", ".join(sorted({str(o) for o in ops})) if ops else "unknown"
    fname = _name(func)
    msg = (
        f"ShardTensor has no sharding rule for {fname} (aten ops: {aten}). Register one:\n"
        f"    from meshshard.shardtensor import register_handler\n"
        f"    @register_handler({fname})        # or the aten op, e.g. torch.ops.{_first(ops)}\n"
        f"    def my_rule(*args, **kwargs): ...  # compute on .to_local() pieces, wrap with "
        f"from_local\n"
        f"or opt in to gathering: `with meshshard.shardtensor.allow_gather_fallback(): ...`"
    )
    raise NoShardingRuleError(msg)


# (func, per-argument kind/ndim/dtype) of keyword-free calls already classified, with no
# function- or aten-level handler -> whether every aten op they run is pointwise. Emptied
# whenever a handler is (un)registered (the classification depends on which ops have one).
_ROUTES: dict = {}
on_registry_change(_ROUTES.clear)


def _route_key(func, args: tuple) -> Any:
    for a in args:
        if isinstance(a, (list, tuple, dict)):
            return None
    key = (func, tuple(_leaf_key(v) for v in args))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _first(ops) -> str:
    return str(sorted(ops, key=str)[0]) if ops else "aten.<op>.default"


_PASSTHROUGH = {
    torch.Tensor.size,
    torch.Tensor.dim,
    torch.Tensor.numel,
    torch.Tensor.__len__,
    torch.Tensor.element_size,
    torch.Tensor.is_floating_point,
    torch.Tensor.is_complex,
    torch.Tensor.get_device,
    torch.Tensor.stride,
    torch.Tensor.is_contiguous,
    torch.Tensor.nelement,
    torch.Tensor.__hash__,
    torch.is_floating_point,
    torch.is_complex,
    torch.numel,
}


# ---------------------------------------------------------------------------- classification
class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


_TRACE_CACHE: dict = {}


def _leaf_key(v: Any) -> Any:
    if isinstance(v, ShardTensor):  # read the spec and local piece: `v.ndim` would dispatch
        return ("T", len(v._spec.shape), v._local.dtype)
    if isinstance(v, torch.Tensor):
        return ("T", v.ndim, v.dtype)
    if isinstance(v, (int, float, bool, str, type(None))):
        return (type(v).__name__,)
    return (type(v).__name__,)


def _trace(func, args, kwargs):
    """Run ``func`` on meta tensors of the global shapes and record the aten ops it calls.

    Returns (ops or None, single_call): ``single_call`` is (op, args, kwargs) with the original
    ShardTensors in place when the function is exactly one aten call on its inputs."""
    if not kwargs and not any(isinstance(a, (list, tuple, dict)) for a in args):
        flat, spec = list(args), None
    else:
        flat, spec = tree_flatten((args, kwargs))
    key = None
    try:
        key = (func, tuple(_leaf_key(v) for v in flat))
        hash(key)
    except TypeError:
        key = None
    cached = _TRACE_CACHE.get(key) if key is not None else None
    if cached is not None:
        ops, single_op = cached
        if single_op is None or get_handler(single_op) is None:
            return ops, None  # classification known; no need to run on meta again
    metas = {}

    def to_meta(v):
        if isinstance(v, torch.Tensor):
            shape = v._spec.shape if isinstance(v, ShardTensor) else v.shape
            m = torch.empty(shape, dtype=v.dtype, device="meta")
            metas[id(m)] = v
            return m
        return v

    meta_flat = [to_meta(v) for v in flat]
    margs, mkwargs = (meta_flat, {}) if spec is None else tree_unflatten(meta_flat, spec)
    rec = _Recorder()
    try:
        with rec:
            func(*margs, **mkwargs)
    except Exception as exc:  # some functions cannot run on meta tensors
        _state.last_trace_error = exc
        return None, None
    _state.last_trace_error = None
    ops = [c[0] for c in rec.calls]
    single = None
    if len(rec.calls) == 1:
        op, a, k = rec.calls[0]
        mapped_ok = True

        def back(v):
            nonlocal mapped_ok
            if isinstance(v, torch.Tensor):
                if id(v) in metas:
                    return metas[id(v)]
                mapped_ok = False
            return v

        a2 = tree_map(back, a)
        k2 = tree_map(back, k)
        if mapped_ok:
            single = (op, a2, k2)
    if key is not None:
        _TRACE_CACHE[key] = (ops, single[0] if single is not None else None)
    return ops, single


_ALWAYS_POINTWISE = {
    torch.ops.aten.detach.default,
    torch.ops.aten.alias.default,
}


def _is_pointwise(op) -> bool:
    return op in _ALWAYS_POINTWISE or torch.Tag.pointwise in getattr(op, "tags", ())


# ---------------------------------------------------------------------------- helpers
def check_same_mesh(sts: Sequence[ShardTensor]) -> Any:
    mesh = sts[0]._spec.mesh
    for t in sts[1:]:
        m = t._spec.mesh
        if m is not mesh and m != mesh:
            msg = (
                f"ShardTensors live on different DeviceMeshes ({mesh} and {m}); move one with "
                "from_local(t.full_tensor(), mesh, ...) or build both on the same mesh"
            )
            raise LayoutError(msg)
    return mesh


def reduce_partials(st: ShardTensor, mesh_dims: Sequence[int] | None = None) -> ShardTensor:
    """All-reduce Partial placements (on ``mesh_dims`` or all) -> Replicate (differentiable)."""
    spec = st._spec
    if not spec.has_partial():
        return st
    key = None if mesh_dims is None else tuple(sorted(mesh_dims))
    cache = st.__dict__.setdefault("_reduced_cache", {})
    if key in cache:
        return cache[key]
    local = st._local
    placements = list(spec.placements)
    for i, p in enumerate(spec.placements):
        if isinstance(p, Partial) and (mesh_dims is None or i in mesh_dims):
            local = C.all_reduce(local, p.reduce_op, mesh_group(spec.mesh, i))
            placements[i] = Replicate()
    if placements == list(spec.placements):
        return st
    out = wrap(local, intern_spec(spec.with_changes(placements=tuple(placements))))
    cache[key] = out  # one reduction per Partial tensor, however many consumers it has
    return out


def align_sizes(t: ShardTensor, operands: Sequence[Any], out_ndim: int) -> ShardTensor:
    """Redistribute ``t`` to the shard sizes of the first operand that shards the same
    (broadcast-aligned) dim on the same mesh dim, when they differ. Rows move only between the
    ranks whose ranges differ (uneven all-to-all); differentiable; collective."""
    spec = t._spec
    target = list(spec.sizes)
    changed = False
    for i, p in enumerate(spec.placements):
        if not isinstance(p, Shard):
            continue
        d = p.dim + out_ndim - spec.ndim
        for o in operands:
            if not isinstance(o, ShardTensor):
                continue
            q = o._spec.placements[i]
            if isinstance(q, Shard) and q.dim + out_ndim - o._spec.ndim == d:
                if o._spec.sizes[i] != spec.sizes[i] and sum(o._spec.sizes[i]) == sum(
                    spec.sizes[i]
                ):
                    target[i] = o._spec.sizes[i]
                    changed = True
                break
    if not changed:
        return t
    log.debug("redistributing %s to sizes %s to match another operand", spec.describe(), target)
    return t.redistribute(spec.placements, target)


def replicated_local(
    t: Any, spec_out: ShardSpec, aligned_dims: dict[int, int] | None = None
) -> torch.Tensor:
    """Local piece of a replicated operand (plain tensor or all-Replicate ShardTensor) for an op
    whose output has ``spec_out``.

    ``aligned_dims`` maps mesh dim -> this operand's dim that lines up with the output's
    sharded dim (if it has full size there, its local rows are cut out); for every other
    non-replicated output mesh dim, the gradient is summed over that mesh dim in backward.
    """
    local = t._local if isinstance(t, ShardTensor) else t
    if not isinstance(local, torch.Tensor):
        return local
    mesh = spec_out.mesh
    groups = []
    for i, p in enumerate(spec_out.placements):
        if isinstance(p, Replicate):
            continue
        d = None if aligned_dims is None else aligned_dims.get(i)
        if isinstance(p, Shard) and d is not None and local.shape[d] != 1:
            local = C.split_local(local, d, spec_out.sizes[i], mesh_group(mesh, i))
        else:
            groups.append(mesh_group(mesh, i))
    if groups:
        local = C.grad_all_reduce(local, groups)
    return local


def wrap_outputs(out: Any, spec_of: Callable[[torch.Tensor], ShardSpec]) -> Any:
    if isinstance(out, torch.Tensor):
        return wrap(out, spec_of(out))
    if isinstance(out, (tuple, list)):
        vals = [wrap_outputs(o, spec_of) for o in out]
        if hasattr(out, "_fields") or type(out).__name__.startswith("torch.return_types"):
            return type(out)(vals)
        try:
            return type(out)(vals)
        except TypeError:
            return tuple(vals)
    return out


# ---------------------------------------------------------------------------- generic rules
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


def _gather_fallback(func, args, kwargs, ops):
    key = func
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(
            f"ShardTensor: no sharding rule for {_name(func)}; gathering the full tensors, "
            "computing, and re-sharding (allow_gather_fallback is on). Register a handler to "
            "avoid the gather.",
            stacklevel=3,
        )
    flat, tspec = tree_flatten((args, kwargs))
    sts = [t for t in flat if isinstance(t, ShardTensor)]
    first = sts[0]
    mesh = check_same_mesh(sts)
    full = [t.full_tensor() if isinstance(t, ShardTensor) else t for t in flat]
    a, k = tree_unflatten(full, tspec)
    out = func(*a, **k)
    from meshshard.shardtensor.redistribute import redistribute

    def reshard(o):
        rep = tuple(Replicate() for _ in range(mesh.ndim))
        st = wrap(o, ShardSpec(mesh, rep, (None,) * mesh.ndim, o.shape))
        if o.ndim == first._spec.ndim and all(
            not isinstance(p, Shard) or o.shape[p.dim] == first._spec.shape[p.dim]
            for p in first._spec.placements
        ):
            targ = [
                Replicate() if isinstance(p, Partial) else p for p in first._spec.placements
            ]
            return redistribute(st, targ, list(first._spec.sizes))
        return st

    if isinstance(out, torch.Tensor):
        return reshard(out)
    if isinstance(out, (tuple, list)):
        return type(out)(reshard(o) if isinstance(o, torch.Tensor) else o for o in out)
    return out
