"""The shared second and third phase of the distributed kNN (see
:mod:`meshshard.ops.functional`): queries go to the ranks whose boxes lie within their bound,
the answers come back, and each query keeps its k best candidates by (distance, index).

Used by :func:`meshshard.ops.functional.knn` (all queries at once) and by
:func:`meshshard.ops.knn_chunks.knn_chunks` (queries a chunk at a time against one local
index). Collective.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from meshshard.comm.rows import all_to_all, exchange_plan
from meshshard.ops import kernels
from meshshard.ops.cell_index import _select

__all__ = ["answer_knn_queries", "forward_and_merge", "route"]

Answer = Callable[[torch.Tensor, list[int]], tuple[torch.Tensor, torch.Tensor]]


def _lexsort3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Permutation ordering by (a, b, c) (stable sorts from the last key)."""
    o = torch.argsort(c, stable=True)
    o = o[torch.argsort(b[o], stable=True)]
    return o[torch.argsort(a[o], stable=True)]


def _drop_self(
    d2: torch.Tensor, idx: torch.Tensor, k: int, self_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """From (m, k+1) sorted candidates drop each row's own index (or the last one)."""
    is_self = idx == self_idx[:, None]
    o = torch.argsort(is_self.to(torch.int8), dim=1, stable=True)[:, :k]
    return d2.gather(1, o), idx.gather(1, o)


def answer_knn_queries(
    x: torch.Tensor,
    queries: torch.Tensor,
    k: int,
    *,
    backend: str = "auto",
    index: kernels.KnnIndex | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's answer to forwarded kNN queries: its k nearest within each query's bound.

    Pure (no communication); also used by ``benchmarks/bench_ops.py`` to count traffic.

    Parameters
    ----------
    x : Tensor of shape (n, d)
        The answering rank's points.
    queries : Tensor of shape (R, d + 1), float64
        Query coordinates followed by the querier's squared bound.
    index : KnnIndex, optional
        ``x`` already indexed (reused across calls).

    Returns
    -------
    d2 : Tensor of shape (R, k), float64
        Squared distances, ascending; ``inf`` past the bound or the points.
    idx : Tensor of shape (R, k), int64
        Local rows in ``x``; ``-1`` where ``d2`` is ``inf``.
    """
    d = queries.shape[1] - 1
    if index is None:
        index = kernels.KnnIndex(x, backend=backend)
    return index.within(queries[:, :d], k, queries[:, d])


def route(mask: torch.Tensor, group: dist.ProcessGroup | None, extra: torch.Tensor | None = None
          ) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor, list]:
    """The (row, destination) pairs of ``mask`` (n, P), grouped by destination, and the counts
    both ways: one count exchange (:func:`~meshshard.comm.rows.exchange_plan`), one host
    sync; the pairs are compacted on the device.

    Collective. Returns ``(send, recv, rows, dest, extras)``: ``rows[j]`` goes to rank
    ``dest[j]`` (``sum(send)`` pairs).
    """
    n, P = mask.shape
    send, recv, extras = exchange_plan(mask.sum(0), group, extra)
    total = sum(send)
    flat = mask.t().reshape(-1)  # destination-major
    at = torch.where(flat, torch.cumsum(flat, 0) - 1, total)
    buf = torch.zeros(total + 1, dtype=torch.int64, device=mask.device)
    buf.scatter_(0, at, torch.arange(flat.numel(), device=mask.device))
    pairs = buf[:total]
    if n == 0:
        return send, recv, pairs, pairs, extras
    return send, recv, pairs % n, pairs // n, extras


def forward_and_merge(
    x: torch.Tensor,
    yq: torch.Tensor,
    d2_loc: torch.Tensor,
    i_loc: torch.Tensor,
    bound2: torch.Tensor,
    mask: torch.Tensor,
    *,
    k: int,
    offset: int,
    group: dist.ProcessGroup | None,
    answer: Answer,
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Phases 2 and 3 of the distributed kNN for the queries ``yq`` of this rank.

    One host sync (the forwarded queries' counts); every answer is ``k`` rows (padded), so the
    answers need no count exchange, and the merge is one sort with no data-dependent shape.

    Parameters
    ----------
    x : Tensor of shape (n, d)
        This rank's points.
    yq : Tensor of shape (m, d)
        This rank's queries (all of them, or one chunk).
    d2_loc, i_loc : Tensor of shape (m, k)
        The local answer (squared distances, local rows; ``inf`` / ``-1`` padding).
    bound2, mask : Tensor of shape (m,) and (m, P)
        From :func:`meshshard.ops._regions.knn_forward_mask`.
    offset : int
        Global index of this rank's first point.
    answer : callable
        ``answer(queries, counts)`` answers forwarded queries from ``x`` with ``(d2, idx)`` of
        shape (R, k) (:func:`answer_knn_queries`); ``counts[q]`` came from rank ``q``.

    Returns
    -------
    dist, index : Tensor of shape (m, k)
        Distances (differentiable) and global indices.
    sent : int
        Queries this rank forwarded.
    answered : Tensor, 0-dim int64 (on the device)
        Candidate rows this rank answered (not padding).
    """
    device = x.device
    m, n, dim = yq.shape[0], x.shape[0], x.shape[1]
    # phase 2: forward queries (with their bound) to the ranks that may hold closer points
    nfwd = mask.sum(1)
    most = nfwd.max().reshape(1) if m else torch.zeros(1, dtype=torch.int64, device=device)
    send, recv, qid, dest, extras = route(mask, group, most)  # the one host sync
    F = int(extras[dist.get_rank(group)][0])  # most ranks one query went to
    Q = sum(send)
    qpack = torch.cat([yq.detach().double()[qid], bound2[qid, None]], 1)  # (Q, d + 1)
    queries = all_to_all(qpack, send, recv, group)
    rd2, ri = answer(queries, recv)  # (R, k) each, padded
    R = ri.shape[0]
    answered = (ri >= 0).sum()
    g = torch.where(ri >= 0, ri + offset, -1).double()  # index < 2**53: exact
    ans = all_to_all(torch.cat([rd2, g], 1), recv, send, group)  # (Q, 2k)
    if n:
        xyz = x[ri.clamp_min(0)].reshape(R, k * dim)  # padding rows carry x[0], never chosen
    else:  # nothing to answer from, but the all-to-all below stays in the graph
        xyz = x.new_zeros((R, k * dim)) + x.sum()
    ans_xyz = all_to_all(xyz, recv, send, group).reshape(Q * k, dim)  # differentiable

    # phase 3: merge local and remote candidates, keep the k best by (distance, index): one
    # row of k * (1 + F) candidates per query (its local k, then k per rank it went to)
    big = torch.iinfo(torch.int64).max
    index = torch.where(i_loc >= 0, i_loc + offset, -1)
    rows = i_loc
    if F:
        W = k * (1 + F)
        cd2 = d2_loc.new_full((m, W), float("inf"))
        cg = torch.full((m, W), big, dtype=torch.int64, device=device)
        crow = torch.full((m, W), -1, dtype=torch.int64, device=device)
        cd2[:, :k], cg[:, :k], crow[:, :k] = d2_loc, torch.where(i_loc >= 0, index, big), i_loc
        slot = (torch.cumsum(mask, 1) - 1)[qid, dest]  # the j-th rank this query went to
        cols = k + slot[:, None] * k + torch.arange(k, device=device)[None, :]  # (Q, k)
        at = (qid[:, None].expand(Q, k), cols)
        rem_g = ans[:, k:].long()
        cd2 = cd2.index_put(at, ans[:, :k])
        cg = cg.index_put(at, torch.where(rem_g >= 0, rem_g, big))
        crow = crow.index_put(at, n + torch.arange(Q * k, device=device).reshape(Q, k))
        cols_all = torch.arange(W, device=device).expand(m, W)
        _, take = _select(cd2, cg, cols_all, k)
        take = take.clamp_min(0)
        index = cg.gather(1, take)
        index = torch.where(index == big, -1, index)
        rows = crow.gather(1, take)
    # the selected coordinates, from x or from the answers (no copy of x: it may be large)
    flat = rows.reshape(-1, 1)
    nbr = x.new_zeros((m * k, dim))
    if n:
        nbr = torch.where(flat < n, x[flat[:, 0].clamp(0, n - 1)], nbr)
    if Q:
        nbr = torch.where(flat >= n, ans_xyz[(flat[:, 0] - n).clamp(0, Q * k - 1)], nbr)
    else:  # keep the answers in the graph: their backward all-to-all is collective
        nbr = nbr + ans_xyz[:0].sum()
    dist_out = torch.linalg.vector_norm(yq[:, None, :] - nbr.reshape(m, k, dim), dim=-1)
    return dist_out, index, Q, answered
