"""Routing torch functions on ShardTensors to sharding rules.

:func:`dispatch_function` is the entry point of every torch function on a ShardTensor: a
registered handler, else a cached or traced classification (:mod:`._classify`) into the generic
rules (:mod:`._generic`), else the opt-in gather fallback (:mod:`._fallback`), else a
:class:`NoShardingRuleError` that says how to register a rule. The layout helpers the rules share
live in :mod:`._layout`; they are re-exported here for existing imports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from meshshard.errors import MeshShardError
from meshshard.shardtensor._classify import _ROUTES, _is_pointwise, _route_key, _trace
from meshshard.shardtensor._classify import _state as _trace_state
from meshshard.shardtensor._fallback import _gather_fallback, allow_gather_fallback
from meshshard.shardtensor._fallback import _state as _fallback_state
from meshshard.shardtensor._generic import pointwise_apply, replicated_apply
from meshshard.shardtensor._layout import (
    LayoutError,
    align_sizes,
    check_same_mesh,
    reduce_partials,
    replicated_local,
    wrap,
    wrap_outputs,
)
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import _name, get_handler

__all__ = [
    "LayoutError",
    "NoShardingRuleError",
    "allow_gather_fallback",
    "dispatch_function",
    # re-exported from ._layout and ._generic for existing imports
    "align_sizes",
    "check_same_mesh",
    "pointwise_apply",
    "reduce_partials",
    "replicated_apply",
    "replicated_local",
    "wrap",
    "wrap_outputs",
]


class NoShardingRuleError(MeshShardError, NotImplementedError):
    """A torch function has no sharding rule for ShardTensor arguments."""


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
    if getattr(_fallback_state, "fallback", False):
        return _gather_fallback(func, args, kwargs, ops)
    err = getattr(_trace_state, "last_trace_error", None)
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
