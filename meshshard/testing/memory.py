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

    def count(t: torch.Tensor) -> None:
        if hasattr(type(t), "__tensor_flatten__"):  # a wrapper subclass (ShardTensor,
            for name in t.__tensor_flatten__()[0]:  # DTensor): its inner tensors' storage
                count(getattr(t, name))
            return
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())

    def pack(t: torch.Tensor) -> torch.Tensor:
        count(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())
