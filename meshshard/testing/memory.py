"""Memory measurements shared by the benchmarks and tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def saved_activation_bytes(fn: Callable[[], T]) -> tuple[T, int]:
    """Run ``fn`` and count the bytes of every distinct storage autograd saves for backward
    (each storage once, however many saved tensors view it). Returns ``(fn(), bytes)``."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        for piece in _pieces(t):
            s = piece.untyped_storage()
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def _pieces(t: torch.Tensor):
    """The plain tensors holding ``t``'s data: a wrapper subclass (ShardTensor, DTensor) has no
    storage of its own, its inner tensors do."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        for n in names:
            yield from _pieces(getattr(t, n))
    else:
        yield t
