"""Morton / Hilbert codes in torch, bit for bit equal to :mod:`meshshard.partition.sfc`'s numpy
codes, so keys of device tensors are computed on the device (CUDA or CPU).

Same grid (float64 ``(p - lo) * (2**bits - 1) / extent``, truncated), same Skilling transform
and the same magic-number bit spreading, on int64 tensors.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["torch_codes"]

_SPREAD3 = (
    (32, 0x1F00000000FFFF),
    (16, 0x1F0000FF0000FF),
    (8, 0x100F00F00F00F00F),
    (4, 0x10C30C30C30C30C3),
    (2, 0x1249249249249249),
)
_SPREAD2 = (
    (16, 0x0000FFFF0000FFFF),
    (8, 0x00FF00FF00FF00FF),
    (4, 0x0F0F0F0F0F0F0F0F),
    (2, 0x3333333333333333),
    (1, 0x5555555555555555),
)


def _quantise(pts: torch.Tensor, bits: int, lo: np.ndarray, hi: np.ndarray) -> torch.Tensor:
    extent = float((hi - lo).max())
    if pts.shape[0] == 0 or extent == 0.0:
        return torch.zeros(pts.shape, dtype=torch.int64, device=pts.device)
    scale = ((1 << bits) - 1) / extent
    lo_t = torch.as_tensor(lo, dtype=torch.float64, device=pts.device)
    return ((pts.to(torch.float64) - lo_t) * scale).to(torch.int64)  # >= 0: truncation


def _spread(v: torch.Tensor, dim: int) -> torch.Tensor:
    x = v & (0x1FFFFF if dim == 3 else 0xFFFFFFFF)
    for shift, mask in _SPREAD3 if dim == 3 else _SPREAD2:
        x = (x | (x << shift)) & mask
    return x


def _interleave(q: list[torch.Tensor]) -> torch.Tensor:
    dim = len(q)
    code = torch.zeros_like(q[0])
    for axis in range(dim):
        code |= _spread(q[axis], dim) << (dim - 1 - axis)
    return code


def _hilbert_transpose(x: list[torch.Tensor], bits: int) -> list[torch.Tensor]:
    dim = len(x)
    x = [c.clone() for c in x]
    for level in range(bits - 1, 0, -1):
        p = (1 << level) - 1
        for i in range(dim):
            hit = (0 - ((x[i] >> level) & 1)) & p
            if i == 0:
                x[0] ^= hit
                continue
            t = (x[0] ^ x[i]) & p & ~hit
            x[0] ^= hit ^ t
            x[i] ^= t
    for i in range(1, dim):
        x[i] ^= x[i - 1]
    t = torch.zeros_like(x[0])
    for level in range(bits - 1, 0, -1):
        t ^= (0 - ((x[dim - 1] >> level) & 1)) & ((1 << level) - 1)
    return [c ^ t for c in x]


def torch_codes(
    pts: torch.Tensor, bits: int, method: str, lo: np.ndarray, hi: np.ndarray
) -> torch.Tensor:
    """int64 Morton or Hilbert codes of ``pts`` (on its device) on the grid of the box
    ``[lo, hi]``; equal to ``meshshard.partition.sfc._encode(..., bounds=(lo, hi))``."""
    q = _quantise(pts, bits, lo, hi)
    cols = [q[:, i].contiguous() for i in range(q.shape[1])]
    if method == "hilbert":
        cols = _hilbert_transpose(cols, bits)
    return _interleave(cols)
