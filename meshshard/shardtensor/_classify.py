"""Classifying a torch function on ShardTensors by the aten ops it runs, with the caches that
let a repeated call skip the classification.

:func:`_trace` runs the function once on meta tensors of the global shapes and records its aten
ops (cached per function and argument kinds); :data:`_ROUTES` remembers, for keyword-free calls
without a handler, whether every op is pointwise, so that the next such call goes straight to
its rule."""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import get_handler, on_registry_change

# per thread: ``last_trace_error``, the exception of the last :func:`_trace` that could not run
# the function on meta tensors (None after one that could)
_state = threading.local()


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
