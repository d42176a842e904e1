"""Recursive coordinate bisection (RCB) for any number of parts.

A node holding parts ``[a, b)`` is split into ``floor(n/2)`` and ``ceil(n/2)`` parts along the
longest extent of its points' bounding box, at the weighted quantile given by the targets of the
two halves. Each level is processed node by node on contiguous slices of one permutation array
(at most ``2P`` numpy calls per level, none per point).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshshard.partition._validation import (
    as_points,
    check_parts,
    check_targets,
    check_weights,
)
from meshshard.partition.record import Partition
from meshshard.partition.sfc import curve_order, group_by_shard, hilbert_codes

__all__ = ["rcb"]


def _split_index(
    coord: np.ndarray,
    w: np.ndarray | None,
    frac: float,
    lo_min: int,
    hi_min: int,
    idx: np.ndarray,
) -> tuple[np.ndarray, int]:
    """Permutation of ``coord`` and the count ``k`` going left, so that the left weight is
    ``frac`` of the total (clamped to keep ``lo_min`` rows left and ``hi_min`` right).

    Tie rule: points are ordered by ``(coord, idx)`` (``idx``: original row), so the left side
    is always the ``k`` smallest by that key. The distributed RCB applies the same rule and
    so reproduces every cut exactly, duplicate coordinates included."""
    n = coord.size
    if w is None:
        k = int(np.floor(frac * n + 0.5))
        k = min(max(k, lo_min), n - hi_min)
        if 0 < k < n:
            perm = np.argpartition(coord, k - 1)
            return _ties_by_index(coord, perm, k, idx), k
        return np.arange(n), k
    perm = np.argsort(coord, kind="stable")
    cs = coord[perm]
    if n > 1 and bool((cs[1:] == cs[:-1]).any()):  # equal coordinates: order them by row
        perm = np.lexsort((idx, coord))
    ws = w[perm]
    csum = np.cumsum(ws)
    mid = csum - 0.5 * ws
    k = int(np.searchsorted(mid, frac * csum[-1], side="left")) if n else 0
    k = min(max(k, lo_min), n - hi_min)
    return perm, k


def _ties_by_index(coord: np.ndarray, perm: np.ndarray, k: int, idx: np.ndarray) -> np.ndarray:
    """Fix an ``argpartition`` at ``k - 1`` so the first ``k`` are the smallest by
    ``(coord, idx)``; only runs the fix when the k-th value is shared by several points."""
    v = coord[perm[k - 1]]
    eq = coord == v
    n_eq = int(np.count_nonzero(eq))
    if n_eq == 1:
        return perm
    less = np.flatnonzero(coord < v)
    eqpos = np.flatnonzero(eq)
    need = k - less.size  # 1 <= need <= n_eq
    if need < n_eq:
        eqpos = eqpos[np.argsort(idx[eqpos], kind="stable")]
    left = np.concatenate([less, eqpos[:need]])
    mask = np.ones(coord.size, dtype=bool)
    mask[left] = False
    return np.concatenate([left, np.flatnonzero(mask)])


def rcb(
    points: Any,
    parts: int,
    *,
    weights: Any = None,
    targets: Any = None,
    allow_empty: bool = False,
) -> Partition:
    """Recursive coordinate bisection into ``parts`` shards (any P, not only powers of two).

    Parameters
    ----------
    points : array (numpy or torch) of shape (N, 3) or (N, 2)
    parts : int
        Number of shards P >= 1.
    weights : array of shape (N,), optional
        Non-negative per-point work, balanced across shards.
    targets : array of shape (P,), optional
        Fraction of the total weight per shard (sum 1; zeros give empty shards).
    allow_empty : bool
        Allow empty shards when N < P.

    Returns
    -------
    Partition
        Shards are boxes; rows inside a shard follow the Hilbert curve (locality).

    Examples
    --------
    >>> import numpy as np
    >>> rcb(np.random.default_rng(0).random((1000, 3)), 5).sizes.tolist()
    [200, 200, 200, 200, 200]
    """
    pts = as_points(points)
    n = pts.shape[0]
    parts = check_parts(parts, n, allow_empty=allow_empty)
    w = check_weights(weights, n)
    t = check_targets(targets, parts)
    want = (t > 0).astype(np.int64)
    strict = not allow_empty and n >= int(want.sum())
    perm = np.arange(n, dtype=np.int64)
    # Nodes: (row_start, row_end, part_start, part_end) over the permutation.
    nodes = [(0, n, 0, parts)]
    assignment = np.empty(n, dtype=np.int64)
    while nodes:
        nxt = []
        for r0, r1, a, b in nodes:
            if b - a == 1:
                assignment[perm[r0:r1]] = a
                continue
            m = a + (b - a) // 2
            tl, tr = float(t[a:m].sum()), float(t[m:b].sum())
            frac = tl / (tl + tr) if tl + tr > 0 else 0.5
            idx = perm[r0:r1]
            if idx.size:
                sub = pts[idx]
                axis = int(np.argmax(sub.max(axis=0) - sub.min(axis=0)))
                lo_min = int(want[a:m].sum()) if strict else 0
                hi_min = int(want[m:b].sum()) if strict else 0
                local, k = _split_index(
                    sub[:, axis], None if w is None else w[idx], frac, lo_min, hi_min, idx
                )
                perm[r0:r1] = idx[local]
            else:
                k = 0
            nxt.append((r0, r0 + k, a, m))
            nxt.append((r0 + k, r1, m, b))
        nodes = nxt
    stored = group_by_shard(assignment, parts, curve_order(hilbert_codes(pts)))
    sizes = np.bincount(assignment, minlength=parts)
    params = {"targets": t.tolist(), "weighted": w is not None}
    return Partition(assignment, stored, sizes, method="rcb", params=params)
