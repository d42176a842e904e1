"""Where grid rules' outputs live and which input rows each rank reads (numpy only, no
communication): the plans the halo convolutions, pools, pads, transposed convolutions and
resamplings of ``rules/grid_*.py`` execute.

Ownership rule (stated once, used by every grid rule): output index ``j`` along a sharded dim
belongs to the rank that owns its *anchor* input row, clamped to ``[0, N - 1]``:

- conv / pool: the centre of the receptive field, ``j*stride - pad_left + dilation*(k-1)//2``
  (a stride-1 "same" conv keeps the layout; a stride-2 conv or pool with kernel 2 or 3 gives
  output ``j`` to the owner of input ``2j``; a patch embedding gives each patch to the owner of
  its centre row). Strides are aligned to the global index.
- conv_transpose: ``(j + pad) // stride`` (the input whose stride block holds ``j``).
- F.pad: ``j - pad_left``; interpolate: the lower source row.

Anchors are monotone in ``j``, so every rank gets one contiguous run of outputs (possibly
empty); the resulting sizes are recorded in the output's layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["DimPlan", "divisors", "map_rows", "out_sizes_of", "owner_of", "pad_plan",
           "ranges_of", "sliding_plan", "transpose_plan"]


@dataclass(frozen=True)
class DimPlan:
    """One sharded spatial dim: output sizes per rank and every rank's needed input rows
    (global indices; -1 = the fill value)."""

    dim: int
    mesh_dim: int
    out_sizes: tuple
    needs: tuple
    periodic: bool = False


def owner_of(idx: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Rank owning each global row index (indices must lie in ``[0, sum(sizes))``). Empty
    ranks own nothing."""
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    return np.searchsorted(ends, idx, side="right")


def out_sizes_of(anchors: np.ndarray, sizes: Sequence[int]) -> tuple:
    """Sizes per rank from each output's anchor input row (already clamped)."""
    own = owner_of(anchors, sizes) if anchors.size else np.zeros(0, dtype=np.int64)
    return tuple(int(v) for v in np.bincount(own, minlength=len(sizes)))


def ranges_of(out_sizes: Sequence[int]) -> list[tuple[int, int]]:
    offs = np.concatenate([[0], np.cumsum(out_sizes)]).astype(int)
    return [(int(offs[r]), int(offs[r + 1])) for r in range(len(out_sizes))]


def sliding_plan(
    dim: int, mesh_dim: int, sizes: Sequence[int], m: int, k: int, s: int, dl: int, pl: int
) -> DimPlan:
    """Plan for a sliding window (conv/pool) of ``m`` outputs over ``N = sum(sizes)`` rows:
    rank r's window covers every input its outputs read; rows outside ``[0, N)`` are fill."""
    n = int(sum(sizes))
    if n == 0:
        msg = f"grid rule: the sharded dim {dim} has global size 0"
        raise ValueError(msg)
    j = np.arange(m, dtype=np.int64)
    anchors = np.clip(j * s - pl + (dl * (k - 1)) // 2, 0, n - 1)
    out_sizes = out_sizes_of(anchors, sizes)
    needs = []
    for j0, j1 in ranges_of(out_sizes):
        if j1 == j0:
            needs.append(())
            continue
        t = np.arange(j0 * s - pl, (j1 - 1) * s - pl + dl * (k - 1) + 1, dtype=np.int64)
        t[(t < 0) | (t >= n)] = -1
        needs.append(tuple(t.tolist()))
    return DimPlan(dim, mesh_dim, out_sizes, tuple(needs))


def map_rows(src: np.ndarray, n: int, mode: str) -> np.ndarray:
    """Input row read by each (possibly out-of-range) source index; -1 = the fill value."""
    src = src.copy()
    out = (src < 0) | (src >= n)
    if mode == "constant":
        src[out] = -1
    elif mode == "reflect":
        src = np.where(src < 0, -src, src)
        src = np.where(src >= n, 2 * (n - 1) - src, src)
    elif mode == "replicate":
        src = np.clip(src, 0, n - 1)
    elif mode == "circular":
        src = np.mod(src, n)
    else:
        msg = f"F.pad mode={mode!r}: use constant, reflect, replicate or circular"
        raise ValueError(msg)
    return src


def pad_plan(dim: int, mesh_dim: int, sizes: Sequence[int], pl: int, pr: int,
             mode: str) -> DimPlan:
    """F.pad of one sharded dim: output ``t`` reads input ``t - pl`` mapped by ``mode`` and
    belongs to the owner of input ``clamp(t - pl)`` (the left pad joins the first non-empty
    shard, the right pad the last one; negative pads crop)."""
    n = int(sum(sizes))
    m = n + pl + pr
    t = np.arange(m, dtype=np.int64)
    out_sizes = out_sizes_of(np.clip(t - pl, 0, max(n - 1, 0)), sizes)
    needs = []
    for t0, t1 in ranges_of(out_sizes):
        src = map_rows(np.arange(t0 - pl, t1 - pl, dtype=np.int64), n, mode)
        needs.append(tuple(src.tolist()))
    return DimPlan(dim, mesh_dim, out_sizes, tuple(needs), periodic=mode == "circular")


def transpose_plan(dim: int, mesh_dim: int, sizes: Sequence[int], m: int, k: int, s: int,
                   dl: int, p: int) -> tuple[DimPlan, tuple]:
    """Plan of a transposed conv plus, per rank, the global raw position of its window's first
    output."""
    n = int(sum(sizes))
    t = np.arange(m, dtype=np.int64)
    out_sizes = out_sizes_of(np.clip((t + p) // s, 0, n - 1), sizes)
    needs, starts = [], []
    for t0, t1 in ranges_of(out_sizes):
        i0 = max(0, -(-(t0 + p - dl * (k - 1)) // s))
        i1 = min(n - 1, (t1 - 1 + p) // s)
        if t1 == t0 or i0 > i1:
            needs.append(())
            starts.append(0)
            continue
        needs.append(tuple(range(i0, i1 + 1)))
        starts.append(t0 + p - i0 * s)
    return DimPlan(dim, mesh_dim, out_sizes, tuple(needs)), tuple(starts)


def divisors(n: int, m: int, k: int, s: int, p: int, include_pad: bool) -> np.ndarray:
    """torch's average-pool divisor along one dim for each of the ``m`` outputs."""
    start = np.arange(m) * s - p
    end = np.minimum(start + k, n + p)
    if include_pad:
        return (end - start).astype(np.float64)
    return (np.minimum(end, n) - np.maximum(start, 0)).astype(np.float64)
