"""Sharding-rule registry: torch functions and aten ops -> handlers.

Handlers are pure functions registered with a decorator that returns them unchanged, so they
can be tested alone. Re-registering raises unless ``override=True``.

Two levels:

- *function level*: keyed by a torch function as Python sees it (``torch.Tensor.cumsum``,
  ``torch.nn.functional.linear``, ``torch.einsum``); the handler receives the same arguments.
- *aten level*: keyed by an aten op (``torch.ops.aten.cumsum.default`` or the packet
  ``torch.ops.aten.cumsum``); used for any torch function that decomposes to exactly that one
  aten op, and called with the aten op's schema arguments (ShardTensors in place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["get_handler", "list_handlers", "register_handler", "unregister_handler"]

_FUNCTION_HANDLERS: dict[Any, Callable] = {}
_ATEN_HANDLERS: dict[Any, Callable] = {}


def _is_aten(op: Any) -> bool:
    return isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))


def _name(op: Any) -> str:
    if _is_aten(op):
        return str(op)
    mod = getattr(op, "__module__", None) or ""
    qual = getattr(op, "__qualname__", None) or getattr(op, "__name__", repr(op))
    if mod.startswith("torch._C"):
        public, prefix = {
            "torch._C._nn": ("torch.nn.functional", ""),
            "torch._C._linalg": ("torch.linalg", "linalg_"),
            "torch._C._fft": ("torch.fft", "fft_"),
            "torch._C._special": ("torch.special", "special_"),
        }.get(mod, ("torch", ""))
        mod = public
        if prefix and qual.startswith(prefix):
            qual = qual[len(prefix) :]
    if "TensorBase" in qual:
        qual = qual.replace("TensorBase", "Tensor")
        mod = "torch"
    return f"{mod}.{qual}" if mod else qual


def register_handler(*ops: Any, override: bool = False) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the sharding rule for ``ops`` (torch functions or aten ops).

    Example
    -------
    >>> @register_handler(torch.Tensor.cumsum, torch.cumsum)     # doctest: +SKIP
    ... def my_cumsum(x, dim, **kw):
    ...     ...

    Raises
    ------
    ValueError
        If an op already has a handler and ``override`` is False.
    """
    if not ops:
        msg = "register_handler needs at least one torch function or aten op"
        raise TypeError(msg)

    def deco(fn: Callable) -> Callable:
        for op in ops:
            table = _ATEN_HANDLERS if _is_aten(op) else _FUNCTION_HANDLERS
            if op in table and not override:
                msg = (
                    f"a ShardTensor handler for {_name(op)} is already registered "
                    f"({table[op].__module__}.{table[op].__qualname__}); "
                    "pass override=True to replace it"
                )
                raise ValueError(msg)
            table[op] = fn
        _changed()
        return fn

    return deco


def unregister_handler(*ops: Any) -> None:
    """Remove handlers (missing ones are ignored)."""
    for op in ops:
        (_ATEN_HANDLERS if _is_aten(op) else _FUNCTION_HANDLERS).pop(op, None)
    _changed()


_LISTENERS: list[Callable[[], None]] = []


def on_registry_change(fn: Callable[[], None]) -> None:
    """Call ``fn`` whenever a handler is registered or removed (dispatch caches that depend on
    which ops have handlers are emptied this way)."""
    _LISTENERS.append(fn)


def _changed() -> None:
    for fn in _LISTENERS:
        fn()


def get_handler(op: Any) -> Callable | None:
    h = _FUNCTION_HANDLERS.get(op)  # the common case first: no isinstance checks
    if h is not None:
        return h
    if _is_aten(op):
        h = _ATEN_HANDLERS.get(op)
        if h is None and isinstance(op, torch._ops.OpOverload):
            h = _ATEN_HANDLERS.get(op.overloadpacket)
        return h
    return _FUNCTION_HANDLERS.get(op)


def list_handlers() -> dict[str, list[str]]:
    """Names of every registered op, by level."""
    return {
        "function": sorted(_name(k) for k in _FUNCTION_HANDLERS),
        "aten": sorted(_name(k) for k in _ATEN_HANDLERS),
    }
