"""Exact radius halo plans from a distributed partition, without a global gather.

Each rank holds the points of its part (after :func:`redistribute_rows`). The part bounding
boxes are exchanged (one all_gather); every rank sends to each other part only its points
within ``r`` of that part's box (the pruning :mod:`meshshard.ops` uses for radius queries);
the receiver keeps the candidates within ``r`` of one of its own points (a cKDTree ball
query, ``<= r`` as :func:`meshshard.partition.halo.halo_plan_radius`) and tells the sender
which ones it kept. The box test lives here because partition must not import ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from meshshard.comm.host import Comm
from meshshard.partition._validation import as_points
from meshshard.partition.distributed._record import DistributedPartition

__all__ = [
    "HaloPiece",
    "box_mindist2",
    "halo_plan_graph_distributed",
    "halo_plan_radius_distributed",
]


@dataclass(frozen=True)
class HaloPiece:
    """This rank's (= part's) entries of a :class:`meshshard.partition.HaloPlan`:
    ``send_ptr[p]``, ``send_idx[p]``, ``recv_ptr[p]``, ``recv_idx[p]`` for ``p = rank``."""

    part: int
    offsets: np.ndarray
    send_ptr: np.ndarray
    send_idx: np.ndarray
    recv_ptr: np.ndarray
    recv_idx: np.ndarray


def box_mindist2(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Squared distance from each row of ``x`` to the box ``[lo, hi]`` (0 inside)."""
    d = np.maximum(np.maximum(lo - x, x - hi), 0.0)
    return np.einsum("ij,ij->i", d, d)


def halo_plan_radius_distributed(
    plan: DistributedPartition,
    owned_points: Any,
    r: float,
    group: Any = None,
) -> HaloPiece:
    """This part's piece of the exact radius halo plan (collective: every rank calls it).

    Parameters
    ----------
    plan : DistributedPartition
        Made with ``parts == world`` (rank ``p`` owns part ``p``).
    owned_points : array of shape (sizes[rank], D)
        This rank's part's points in stored order (e.g. ``redistribute_rows`` of the points).
    r : float
        Radius > 0; a ghost is any point of another part within ``<= r`` of a point of this
        part.

    Returns
    -------
    HaloPiece
        Equal to entry ``rank`` of :func:`halo_plan_radius` on the gathered data.
    """
    from scipy.spatial import cKDTree

    comm = Comm(group, what="halo_plan_radius_distributed")
    W, p = comm.world, comm.rank
    if plan.nparts != W:
        msg = f"halo_plan_radius_distributed needs parts == world size, got {plan.nparts} != {W}"
        raise ValueError(msg)
    pts = as_points(owned_points)
    rr = float(r)
    if not np.isfinite(rr) or rr <= 0:
        msg = f"r={r!r} must be a finite radius > 0"
        raise ValueError(msg)
    if pts.shape[0] != int(plan.sizes[p]):
        msg = f"rank {p}: owned_points has {pts.shape[0]} rows, part {p} has {plan.sizes[p]}"
        raise ValueError(msg)
    dim = pts.shape[1]
    off = plan.offsets
    if pts.shape[0]:
        box = np.concatenate([pts.min(axis=0), pts.max(axis=0)])
    else:
        box = np.concatenate([np.full(dim, np.inf), np.full(dim, -np.inf)])
    comm.phase = "halo boxes"
    boxes = comm.allgather(box)
    # superset test (a hair wider than r); the exact test is the receiver's ball query
    reach = (rr * (1 + 1e-9) + 1e-300) ** 2
    cand_rows, send_counts = [], np.zeros(W, dtype=np.int64)
    for q in range(W):
        if q == p or not pts.shape[0] or not np.isfinite(boxes[q]).all():
            cand_rows.append(np.zeros(0, dtype=np.int64))
            continue
        near = np.flatnonzero(box_mindist2(pts, boxes[q, :dim], boxes[q, dim:]) <= reach)
        cand_rows.append(near)
        send_counts[q] = near.size
    rows = np.concatenate(cand_rows)
    comm.phase = "halo candidates"
    got, recv_counts = comm.alltoallv(pts[rows], send_counts)
    keep = np.zeros(got.shape[0], dtype=bool)
    if got.shape[0] and pts.shape[0]:
        tree = cKDTree(pts, balanced_tree=False, compact_nodes=False)
        keep = tree.query_ball_point(got, rr, return_length=True) > 0
    comm.phase = "halo replies"
    kept, _ = comm.alltoallv(keep.astype(np.uint8), recv_counts, send_counts)
    kept = kept.astype(bool)
    # what this part sends to each q: its candidate rows that q kept (ascending local rows)
    send_idx = rows[kept]
    send_ptr = np.concatenate([[0], np.cumsum(np.bincount(
        np.repeat(np.arange(W), send_counts)[kept], minlength=W))]).astype(np.int64)  # fmt: skip
    # what it receives: the kept candidates, grouped by source part in part order
    # (the source's local rows are ascending, so global stored rows are too)
    src = np.repeat(np.arange(W), recv_counts)
    comm.phase = "halo rows"
    ghost_local, _ = comm.alltoallv(rows, send_counts, recv_counts)
    recv_idx = (off[src] + ghost_local)[keep].astype(np.int64)
    recv_ptr = np.searchsorted(recv_idx, off).astype(np.int64)
    return HaloPiece(p, off, send_ptr, send_idx.astype(np.int64), recv_ptr, recv_idx)


def halo_plan_graph_distributed(
    plan: DistributedPartition,
    local_graph: Any,
    rings: int = 1,
    group: Any = None,
) -> HaloPiece:
    """This part's piece of the ``rings``-deep graph halo plan (collective).

    Parameters
    ----------
    plan : DistributedPartition
        Made with ``parts == world``.
    local_graph : scipy.sparse matrix of shape (n_local, N)
        This rank's input rows of the symmetric adjacency, columns = global input rows.
    rings : int
        Graph hops (>= 1).

    Returns
    -------
    HaloPiece
        Equal to entry ``rank`` of :func:`meshshard.partition.halo.halo_plan_graph` on the
        gathered graph. Each ring is one all_to_all of (part, vertex) requests to the rank
        holding the vertex's row; nothing is gathered.
    """
    import scipy.sparse as sp

    comm = Comm(group, what="halo_plan_graph_distributed")
    W, rank = comm.world, comm.rank
    P, N = plan.nparts, plan.num_points
    n = plan.dest.shape[0]
    if P != W:
        msg = f"halo_plan_graph_distributed needs parts == world size, got {P} != {W}"
        raise ValueError(msg)
    g = sp.csr_matrix(local_graph)
    if g.shape != (n, N):
        msg = f"rank {rank}: local_graph has shape {g.shape}, expected ({n}, {N})"
        raise ValueError(msg)
    if isinstance(rings, bool) or not isinstance(rings, (int, np.integer)) or rings < 1:
        msg = f"rings={rings!r} must be an int >= 1"
        raise ValueError(msg)
    starts = np.concatenate([[0], np.cumsum(plan.counts)]).astype(np.int64)
    off = int(starts[rank])
    nn = max(N, 1)
    deg = np.diff(g.indptr)
    fp, fv = plan.dest.astype(np.int64), np.arange(off, off + n, dtype=np.int64)
    ghosts = np.zeros(0, dtype=np.int64)  # sorted part * N + vertex keys, vertices held here
    for ring in range(int(rings)):
        lv = fv - off
        reps = deg[lv]
        first = np.repeat(g.indptr[lv] - np.cumsum(reps) + reps, reps)
        nbr = g.indices[first + np.arange(int(reps.sum()))].astype(np.int64)
        cand = np.unique(np.repeat(fp, reps) * nn + nbr)
        holder = np.searchsorted(starts, cand % nn, side="right") - 1
        o = np.argsort(holder, kind="stable")
        comm.phase = f"halo ring {ring + 1}"
        got, _ = comm.alltoallv(cand[o], np.bincount(holder, minlength=W).astype(np.int64))
        got = np.unique(got)
        gp, gv = got // nn, got % nn
        got = got[plan.dest[gv - off] != gp]  # not the part's own rows
        if ghosts.size and got.size:
            at = np.minimum(np.searchsorted(ghosts, got), ghosts.size - 1)
            got = got[ghosts[at] != got]  # not reached on an earlier ring
        done = int(comm.allreduce(np.array([got.size], dtype=np.int64))[0]) == 0
        ghosts = np.sort(np.concatenate([ghosts, got]))
        fp, fv = got // nn, got % nn
        if done:
            break
    dest, v = ghosts // nn, ghosts % nn
    stored = plan.offsets[plan.dest[v - off]] + plan.position[v - off]
    src = plan.dest[v - off]
    comm.phase = "halo lists"
    o = np.argsort(dest, kind="stable")
    recv, _ = comm.alltoallv(stored[o], np.bincount(dest, minlength=W).astype(np.int64))
    recv_idx = np.sort(recv)
    recv_ptr = np.searchsorted(recv_idx, plan.offsets).astype(np.int64)
    o = np.argsort(src, kind="stable")
    pairs = np.stack([dest[o], stored[o]], axis=1)
    sent, _ = comm.alltoallv(pairs, np.bincount(src, minlength=W).astype(np.int64))
    o = np.lexsort((sent[:, 1], sent[:, 0]))
    send_idx = sent[o, 1] - plan.offsets[rank]
    send_ptr = np.searchsorted(sent[o, 0], np.arange(W + 1)).astype(np.int64)
    return HaloPiece(rank, plan.offsets, send_ptr, send_idx.astype(np.int64), recv_ptr, recv_idx)
