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

from meshshard.comm.rows import all_to_all, exchange_counts
from meshshard.ops import kernels

__all__ = ["answer_knn_queries", "forward_and_merge"]

_Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
Answer = Callable[[torch.Tensor, list[int]], _Rows]


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A rank's answer to forwarded kNN queries: its k nearest within each query's bound.

    Pure (no communication); also used by ``benchmarks/bench_ops.py`` to count traffic.

    Parameters
    ----------
    x : Tensor of shape (n, d)
        The answering rank's points.
    queries : Tensor of shape (R, d + 1), float64
        Query coordinates followed by the querier's squared bound.

    Returns
    -------
    jr, jc : Tensor of shape (A,), int64
        Query row and rank of each returned candidate (grouped by query row).
    d2 : Tensor of shape (A,), float64
    idx : Tensor of shape (A,), int64
        Local row in ``x``.
    """
    d = queries.shape[1] - 1
    rd2, ri = kernels.knn(x, queries[:, :d], k, backend=backend)
    ok = (ri >= 0) & (rd2 <= queries[:, d:])  # <=: a tie with the bound may win by index
    jr, jc = torch.nonzero(ok, as_tuple=True)
    return jr, jc, rd2[jr, jc], ri[jr, jc]


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
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Phases 2 and 3 of the distributed kNN for the queries ``yq`` of this rank.

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
        ``answer(queries, counts)`` answers forwarded queries from ``x``
        (:func:`answer_knn_queries`); ``counts[q]`` of them came from rank ``q``, in order.

    Returns
    -------
    dist, index : Tensor of shape (m, k)
        Distances (differentiable) and global indices.
    sent, answered : int
        Queries this rank forwarded and candidate rows it answered.
    """
    P = dist.get_world_size(group)
    device = x.device
    m, n, dim = yq.shape[0], x.shape[0], x.shape[1]
    # phase 2: forward queries (with their bound) to the ranks that may hold closer points
    qrank, qid = torch.nonzero(mask.t(), as_tuple=True)  # grouped by destination rank
    send_counts = torch.bincount(qrank, minlength=P).tolist()
    recv_counts = exchange_counts(send_counts, group, device)
    qpack = torch.cat([yq.detach().double()[qid], bound2[qid, None]], 1)  # (Q, d + 1)
    queries = all_to_all(qpack, send_counts, recv_counts, group)
    # answers: only candidates within the querier's bound (all it can use), as flat rows
    jr, _, rd2, ri = answer(queries, recv_counts)
    src = torch.repeat_interleave(
        torch.arange(P, device=device), torch.tensor(recv_counts, device=device)
    )
    recv_off = torch.cumsum(torch.tensor(recv_counts, device=device), 0)
    recv_off = recv_off - torch.tensor(recv_counts, device=device)
    ans_counts = torch.bincount(src[jr], minlength=P).tolist()
    back_counts = exchange_counts(ans_counts, group, device)
    slot = (jr - recv_off[src[jr]]).double()
    meta_rows = torch.stack([slot, rd2, (ri + offset).double()], 1)  # index < 2**53: exact
    ans = all_to_all(meta_rows, ans_counts, back_counts, group)
    ans_xyz = all_to_all(x[ri], ans_counts, back_counts, group)  # differentiable

    # phase 3: merge local and remote candidates, keep the k best by (distance, index)
    t_send = torch.tensor(send_counts, device=device)
    send_off = torch.cumsum(t_send, 0) - t_send
    a_src = torch.repeat_interleave(
        torch.arange(P, device=device), torch.tensor(back_counts, device=device)
    )
    ans_q = qid[send_off[a_src] + ans[:, 0].long()]
    index = torch.where(i_loc >= 0, i_loc + offset, -1)  # local answers, already sorted
    rows = i_loc.clone()
    hq = torch.unique(ans_q)  # only queries that got remote candidates need a merge
    if hq.numel():
        pos = torch.full((m,), -1, dtype=torch.int64, device=device)
        pos[hq] = torch.arange(hq.numel(), device=device)
        cand_q = torch.cat(
            [torch.arange(hq.numel(), device=device).repeat_interleave(k), pos[ans_q]]
        )
        cand_d2 = torch.cat([d2_loc[hq].reshape(-1), ans[:, 1]])
        cand_g = torch.cat([index[hq].reshape(-1), ans[:, 2].long()])
        cand_row = torch.cat([i_loc[hq].reshape(-1), n + torch.arange(ans.shape[0], device=device)])
        valid = cand_g >= 0
        cand_q, cand_d2 = cand_q[valid], cand_d2[valid]
        cand_g, cand_row = cand_g[valid], cand_row[valid]
        o = _lexsort3(cand_q, cand_d2, cand_g)
        cand_q, cand_g, cand_row = cand_q[o], cand_g[o], cand_row[o]
        counts = torch.bincount(cand_q, minlength=hq.numel())
        if int(counts.min()) < k:  # pragma: no cover - guarded by validation and bounds
            msg = "knn: internal error, a query collected fewer than k candidates"
            raise RuntimeError(msg)
        start = torch.cumsum(counts, 0) - counts
        take = (start[:, None] + torch.arange(k, device=device)[None, :]).reshape(-1)
        index[hq] = cand_g[take].reshape(-1, k)
        rows[hq] = cand_row[take].reshape(-1, k)
    if m and bool((index < 0).any()):  # pragma: no cover - guarded by validation and bounds
        msg = "knn: internal error, a query collected fewer than k candidates"
        raise RuntimeError(msg)
    # the selected coordinates, from x or from the answers (no copy of x: it may be large)
    flat = rows.reshape(-1)
    mine = flat < n
    nbr = x.new_zeros((flat.numel(), dim))
    nbr[mine] = x[flat[mine]]
    nbr[~mine] = ans_xyz.reshape(-1, dim)[flat[~mine] - n]
    dist_out = torch.linalg.vector_norm(yq[:, None, :] - nbr.reshape(m, k, dim), dim=-1)
    return dist_out, index, int(qid.numel()), int(ri.numel())
