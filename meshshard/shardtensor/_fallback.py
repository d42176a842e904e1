"""Opt-in gather fallback for functions without a sharding rule: gather the ShardTensor inputs,
compute on the full tensors, re-shard the result, and warn once per function."""

from __future__ import annotations

import contextlib
import threading
import warnings

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.utils._pytree import tree_flatten, tree_unflatten

from meshshard.shardtensor._layout import check_same_mesh, wrap
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.redistribute import redistribute
from meshshard.shardtensor.registry import _name
from meshshard.shardtensor.spec import ShardSpec

__all__ = ["allow_gather_fallback"]

# per thread: ``fallback``, whether :func:`allow_gather_fallback` is on
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
