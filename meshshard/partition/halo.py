"""Halo plans: which rows every shard needs from the others, as a :class:`HaloPlan`.

- :func:`halo_plan_graph`: ``rings``-deep ghost layers along a graph (mesh dual or kNN).
- :func:`halo_plan_radius`: exact geometric halos: every point of another shard within
  distance ``r`` (inclusive) of some point of this shard.

Both build the set of (receiving shard, ghost row) pairs with vectorised numpy and turn it into
per-shard CSR send/receive lists in stored (partition) order, ghosts grouped by source shard in
increasing order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from meshshard.partition._validation import as_points, check_graph, unique_int
from meshshard.partition.haloplan import HaloPlan

if TYPE_CHECKING:
    from meshshard.partition.record import Partition

__all__ = [
    "ghost_keys",
    "ghost_rows",
    "halo_plan",
    "halo_plan_graph",
    "halo_plan_radius",
    "plan_from_pairs",
]


def plan_from_pairs(
    partition: Partition,
    dest: np.ndarray,
    ghost: np.ndarray,
    *,
    kind: str,
    params: dict | None = None,
) -> HaloPlan:
    """HaloPlan from pairs "shard ``dest[i]`` needs original row ``ghost[i]``" (duplicates ok).

    Pairs where the ghost already belongs to ``dest`` are ignored.
    """
    P, n = partition.nparts, partition.num_points
    dest = np.asarray(dest, dtype=np.int64)
    stored = partition.inverse[np.asarray(ghost, dtype=np.int64)]
    src = partition.assignment[np.asarray(ghost, dtype=np.int64)]
    keep = src != dest
    key = unique_int(dest[keep] * max(n, 1) + stored[keep])  # sorted by (dest, stored row)
    dest, stored = key // max(n, 1), key % max(n, 1)
    src = np.searchsorted(partition.offsets, stored, side="right") - 1
    off = partition.offsets
    recv_ptr, recv_idx, send_ptr, send_idx = [], [], [], []
    dstart = np.searchsorted(dest, np.arange(P + 1))
    for p in range(P):
        r = stored[dstart[p] : dstart[p + 1]]  # ascending, so grouped by source shard
        recv_idx.append(r.astype(np.int64))
        recv_ptr.append(np.searchsorted(r, off).astype(np.int64))
    order = np.lexsort((stored, dest, src))  # by source shard, then destination, then row
    s_src, s_dest, s_row = src[order], dest[order], stored[order]
    sstart = np.searchsorted(s_src, np.arange(P + 1))
    for q in range(P):
        d = s_dest[sstart[q] : sstart[q + 1]]
        send_idx.append((s_row[sstart[q] : sstart[q + 1]] - off[q]).astype(np.int64))
        send_ptr.append(np.searchsorted(d, np.arange(P + 1)).astype(np.int64))
    plan = HaloPlan(
        offsets=off,
        send_ptr=tuple(send_ptr),
        send_idx=tuple(send_idx),
        recv_ptr=tuple(recv_ptr),
        recv_idx=tuple(recv_idx),
        kind=kind,
        params=params or {},
    )
    return plan


def ghost_keys(assignment: np.ndarray, g: Any, rings: int) -> list[np.ndarray]:
    """Sorted ``shard * N + vertex`` keys of the ghosts of every shard, one array per depth
    ``1 .. rings`` (cumulative: depth ``d`` holds every outside vertex within ``d`` hops of the
    shard). ``g`` is a validated CSR graph; breadth-first, one ring per step, vectorised."""
    a = np.asarray(assignment, dtype=np.int64)
    n = a.size
    deg = np.diff(g.indptr)
    nn = max(n, 1)
    ghosts = np.zeros(0, dtype=np.int64)  # sorted (shard * n + vertex) keys of ghosts so far
    out: list[np.ndarray] = []
    frontier_p, frontier_v = a.copy(), np.arange(n, dtype=np.int64)
    for _ in range(int(rings)):
        reps = deg[frontier_v]
        starts = np.repeat(g.indptr[frontier_v] - np.cumsum(reps) + reps, reps)
        nbr = g.indices[starts + np.arange(reps.sum())].astype(np.int64)
        cand = unique_int(np.repeat(frontier_p, reps) * nn + nbr)
        cand = cand[a[cand % nn] != cand // nn]  # not the shard's own rows
        if ghosts.size and cand.size:
            pos = np.minimum(np.searchsorted(ghosts, cand), ghosts.size - 1)
            cand = cand[ghosts[pos] != cand]  # not reached on an earlier ring
        if cand.size:
            ghosts = np.sort(np.concatenate([ghosts, cand]))
        out.append(ghosts)
        frontier_p, frontier_v = cand // nn, cand % nn
    return out


def ghost_rows(partition: Partition, graph: Any, rings: int = 2) -> list[int]:
    """Ghost rows a refresh ``d`` hops deep moves, for ``d = 1 .. rings``: the distinct
    (shard, outside row) pairs with the row within ``d`` hops of the shard along ``graph``
    (equal to ``halo_plan_graph(partition, graph, d).halo_sizes().sum()``).

    Examples
    --------
    >>> import numpy as np
    >>> from meshshard.partition import knn_graph, partition
    >>> pts = np.random.default_rng(0).random((500, 3))
    >>> one, two = ghost_rows(partition(pts, 4), knn_graph(pts, 6), rings=2)
    >>> two > one > 0
    True
    """
    if isinstance(rings, bool) or not isinstance(rings, (int, np.integer)) or rings < 1:
        msg = f"rings={rings!r} must be an int >= 1"
        raise ValueError(msg)
    g = check_graph(graph, partition.num_points)
    return [int(k.size) for k in ghost_keys(partition.assignment, g, int(rings))]


def halo_plan_graph(partition: Partition, graph: Any, rings: int = 1) -> HaloPlan:
    """Ghost layers ``rings`` hops deep along ``graph``.

    Parameters
    ----------
    partition : Partition
    graph : scipy.sparse matrix of shape (N, N)
        Symmetric adjacency in original row order.
    rings : int
        Number of graph hops (>= 1).

    Returns
    -------
    HaloPlan
        Shard ``p`` receives every vertex of another shard within ``rings`` hops of ``p``.

    Examples
    --------
    >>> import numpy as np
    >>> from meshshard.partition import knn_graph, partition
    >>> pts = np.random.default_rng(0).random((500, 3))
    >>> plan = halo_plan_graph(partition(pts, 4), knn_graph(pts, 6))
    >>> int(plan.halo_sizes().min()) > 0
    True
    """
    n = partition.num_points
    g = check_graph(graph, n)
    if isinstance(rings, bool) or not isinstance(rings, (int, np.integer)) or rings < 1:
        msg = f"rings={rings!r} must be an int >= 1"
        raise ValueError(msg)
    ghosts = ghost_keys(partition.assignment, g, int(rings))[-1]
    nn = max(n, 1)
    dest, ghost = ghosts // nn, ghosts % nn
    return plan_from_pairs(partition, dest, ghost, kind="graph", params={"rings": int(rings)})


def halo_plan_radius(partition: Partition, points: Any, r: float) -> HaloPlan:
    """Exact geometric halos: shard ``p`` receives every point of another shard within
    distance ``r`` (``<= r``) of some point of ``p``.

    Parameters
    ----------
    partition : Partition
    points : array of shape (N, 3) or (N, 2)
        Original-order coordinates.
    r : float
        Radius > 0.

    Returns
    -------
    HaloPlan

    Notes
    -----
    One cKDTree over all points and ``query_pairs(r)``: memory grows with the number of point
    pairs within ``r`` (about N times the mean neighbour count / 2).
    """
    from scipy.spatial import cKDTree

    pts = as_points(points)
    n = partition.num_points
    if pts.shape[0] != n:
        msg = f"points has {pts.shape[0]} rows; the partition has N={n}"
        raise ValueError(msg)
    rr = float(r)
    if not np.isfinite(rr) or rr <= 0:
        msg = f"r={r!r} must be a finite radius > 0"
        raise ValueError(msg)
    a = partition.assignment
    tree = cKDTree(pts, balanced_tree=False, compact_nodes=False)
    pairs = tree.query_pairs(rr, output_type="ndarray").astype(np.int64)
    i, j = pairs[:, 0], pairs[:, 1]
    cross = a[i] != a[j]
    i, j = i[cross], j[cross]
    dest = np.concatenate([a[i], a[j]])
    ghost = np.concatenate([j, i])
    return plan_from_pairs(partition, dest, ghost, kind="radius", params={"r": rr})


def halo_plan(
    partition: Partition,
    *,
    graph: Any = None,
    points: Any = None,
    r: float | None = None,
    rings: int = 1,
) -> HaloPlan:
    """Halo plan from a graph (``rings`` hops) or from geometry (radius ``r``); exactly one.

    Examples
    --------
    >>> import numpy as np
    >>> from meshshard.partition import partition
    >>> pts = np.random.default_rng(0).random((200, 3))
    >>> halo_plan(partition(pts, 2), points=pts, r=0.1).kind
    'radius'
    """
    if (graph is None) == (r is None):
        msg = "pass either graph= (k-ring halo) or points= and r= (radius halo)"
        raise ValueError(msg)
    if graph is not None:
        return halo_plan_graph(partition, graph, rings=rings)
    if points is None:
        msg = "a radius halo needs points= (original-order coordinates)"
        raise ValueError(msg)
    return halo_plan_radius(partition, points, r)
