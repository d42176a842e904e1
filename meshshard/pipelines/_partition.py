"""Partitioning used by the pipelines.

TEMPORARY: ``meshshard.partition.partition`` / ``halo_plan_radius`` are being written on another
branch. Until they land, :func:`partition_points` falls back to a stand-in that sorts points
along x and cuts equal counts, and :func:`halo_plan` to a cKDTree stand-in. Both switch to the
real API as soon as it imports; then this fallback is deleted.
"""

from __future__ import annotations

import logging

import numpy as np

from meshshard.partition import HaloPlan, Partition

log = logging.getLogger(__name__)


def partition_points(points: np.ndarray, parts: int, method: str = "hilbert") -> Partition:
    """Partition ``points`` (n, 3) into ``parts`` shards with ``method``."""
    try:
        from meshshard.partition import partition  # type: ignore[attr-defined]
    except ImportError:
        partition = None
    if partition is not None:
        return partition(points, parts, method=method)
    n = points.shape[0]
    order = np.argsort(points[:, 0], kind="stable")
    assignment = np.empty(n, dtype=np.int64)
    assignment[order] = np.arange(n, dtype=np.int64) * parts // max(n, 1)
    key = np.empty(n, dtype=np.int64)
    key[order] = np.arange(n)
    return Partition.from_assignment(
        assignment, parts, key=key, method="xsort-temporary", params={"requested": method}
    )


def halo_plan(partition: Partition, points: np.ndarray, radius: float) -> HaloPlan:
    """Rows within ``radius`` of another shard, as a :class:`HaloPlan` (stored order)."""
    try:
        from meshshard.partition import halo_plan_radius  # type: ignore[attr-defined]
    except ImportError:
        halo_plan_radius = None
    if halo_plan_radius is not None:
        return halo_plan_radius(partition, points, radius)
    from scipy.spatial import cKDTree

    stored = points[partition.order]
    off = partition.offsets
    P = partition.nparts
    trees = [cKDTree(stored[off[p] : off[p + 1]]) for p in range(P)]
    sends: list[list[np.ndarray]] = [[] for _ in range(P)]
    for p in range(P):  # rows of p within radius of any row of q are sent p -> q
        local = stored[off[p] : off[p + 1]]
        for q in range(P):
            if q == p or local.shape[0] == 0 or trees[q].n == 0:
                sends[p].append(np.zeros(0, dtype=np.int64))
                continue
            d, _ = trees[q].query(local, k=1, distance_upper_bound=radius)
            sends[p].append(np.flatnonzero(np.isfinite(d)).astype(np.int64))
    send_ptr = tuple(np.concatenate([[0], np.cumsum([s.size for s in sends[p]])]) for p in range(P))
    send_idx = tuple(
        np.concatenate(sends[p]) if sends[p] else np.zeros(0, np.int64) for p in range(P)
    )
    recv = [[sends[q][p] + off[q] for q in range(P)] for p in range(P)]
    recv_ptr = tuple(np.concatenate([[0], np.cumsum([r.size for r in recv[p]])]) for p in range(P))
    recv_idx = tuple(np.concatenate(recv[p]).astype(np.int64) for p in range(P))
    return HaloPlan(
        off, send_ptr, send_idx, recv_ptr, recv_idx, kind="radius-temporary", params={"r": radius}
    )
