"""Exact distributed kNN with the queries taken a chunk at a time (bounded working memory).

:func:`meshshard.ops.knn` answers all of a rank's queries at once: its temporaries (a tree
over the shard, local candidates, forward masks, answers, merge keys) are about 0.9 KB per
query at k = 8. Here each rank cuts its points into blocks of ``max_queries_per_chunk``
consecutive rows with their boxes (:class:`~meshshard.ops._blocks.RowBlocks`, no tree over the
shard) and then, round by round, takes that many of its queries, searches them in a small tree
over the blocks their bound reaches, forwards them to the ranks whose boxes lie within their
bound, answers the other ranks' chunks the same way and merges. :func:`knn_chunks` yields
every round's rows, distances and indices as it goes, so a consumer (the features of
``meshshard predict``) streams them and never holds the whole neighbour lists.

Memory: a few blocks' worth of rows per round when consecutive rows are close in space (mesh
order, space-filling-curve order); a shard in random order makes each round reach every block
(still exact, then as slow and as large as one tree over the shard).

The answers equal :func:`meshshard.ops.knn`'s (same candidates, same (distance, index)
order, same distance formula), whatever the chunk size.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from meshshard.comm.rows import all_gather_rows
from meshshard.ops import kernels
from meshshard.ops._blocks import RowBlocks
from meshshard.ops._knn_merge import _drop_self, forward_and_merge
from meshshard.ops._regions import knn_forward_mask, shard_boxes
from meshshard.ops._validation import check_points
from meshshard.ops.api import _is_st, _pair
from meshshard.ops.functional import _check_nboxes

__all__ = ["knn_chunks"]

log = logging.getLogger(__name__)


def _check_chunk(chunk: Any) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        msg = f"knn_chunks: max_queries_per_chunk={chunk!r} must be an int >= 1"
        raise ValueError(msg)
    return chunk


def knn_chunks(
    x: Any,
    k: int,
    y: Any = None,
    *,
    max_queries_per_chunk: int,
    loop: bool = True,
    group: dist.ProcessGroup | None = None,
    x_sizes: list[int] | tuple[int, ...] | None = None,
    backend: str = "auto",
    nboxes: int = 16,
    stats: dict | None = None,
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """Exact k nearest neighbours over all ranks, yielded chunk by chunk of this rank's queries.

    Collective: every rank of the group must iterate the generator to its end (all ranks run
    the same number of rounds, ``ceil(max_r m_r / max_queries_per_chunk)``; a rank whose
    queries ran out takes part with empty chunks). Stopping early on one rank hangs the others.

    Parameters
    ----------
    x : ShardTensor of global shape (N, d), Shard(0) — or this rank's Tensor with ``group``
    k : int
        ``1 <= k <= N`` (``N - 1`` with ``loop=False``).
    y : like ``x``, optional
        Queries (global shape (M, d)); default ``x``.
    max_queries_per_chunk : int
        Query rows per rank per round (>= 1), and rows per block of the points. Working
        memory is about this many times 1 KB (k = 8) times the blocks a chunk reaches
        (a few for spatially coherent row order; see the module docstring).
    loop : bool
        With ``y=None``: ``False`` excludes each point itself.
    group : ProcessGroup, optional
        For local Tensors (a ShardTensor brings its own).
    x_sizes : sequence of int, optional
        Every rank's row count of ``x``; checked when given.
    backend : {"auto", "kdtree", "grid", "brute", "cluster"}
        Local kernel (the per-round trees on the CPU default ``"kdtree"``).
    nboxes : int
        Boxes per rank describing its region.
    stats : dict, optional
        Filled at the end with ``queries``, ``queries_sent``, ``answer_rows`` (summed over
        rounds), ``rounds`` and ``rows_searched`` (rows put into the per-round trees).

    Yields
    ------
    start, stop : int
        This rank's query rows ``start:stop`` (local; empty once its queries ran out).
    dist : Tensor of shape (stop - start, k)
        Ascending distances, as :func:`meshshard.ops.knn` returns them (differentiable per
        chunk: a ``backward`` of one chunk's result is collective like the forward).
    index : Tensor of shape (stop - start, k), int64
        Global indices (stored order), ties broken by the lower index.

    Example
    -------
    >>> for a, b, d, i in knn_chunks(points, 8, loop=False, max_queries_per_chunk=65536):
    ...     features[a:b] = f(d, i)  # doctest: +SKIP
    """
    chunk = _check_chunk(max_queries_per_chunk)
    _check_nboxes(nboxes)
    if _is_st(x) or _is_st(y):
        x, y, group, _, x_sizes = _pair(x, y, "knn_chunks")
    meta = check_points(x, y, group=group, op="knn", k=k, loop=loop, x_sizes=x_sizes)
    rank = dist.get_rank(group)
    offset = meta.x_offsets[rank]
    yq = x if y is None else y
    m, device = yq.shape[0], x.device
    exclude_self = y is None and not loop
    kk = k + 1 if exclude_self else k

    be = kernels.resolve_backend(backend, device)
    blocks = RowBlocks(x, chunk, backend=be)  # boxes of `chunk` consecutive rows, no tree
    boxes = all_gather_rows(shard_boxes(x, nboxes), group)  # (P, B, 2d+1)
    rounds = math.ceil(max(meta.y_sizes) / chunk)
    sent = answered = 0
    for r in range(rounds):
        a, b = min(r * chunk, m), min((r + 1) * chunk, m)
        yc = yq[a:b]
        d2_loc, i_loc = blocks.local_knn(yc, kk)
        if exclude_self:
            d2_loc, i_loc = _drop_self(d2_loc, i_loc, k, torch.arange(a, b, device=device))
        if b > a:
            bound2 = d2_loc[:, k - 1]
        else:
            bound2 = torch.empty(0, dtype=torch.float64, device=device)
        mask, bound2 = knn_forward_mask(yc, bound2, boxes, rank, kk)
        d, i, s, n_ans = forward_and_merge(
            x,
            yc,
            d2_loc,
            i_loc,
            bound2,
            mask,
            k=k,
            offset=offset,
            group=group,
            answer=lambda q, counts: blocks.answer(q, counts, k),
        )
        sent, answered = sent + s, answered + n_ans
        del d2_loc, i_loc, bound2, mask
        yield a, b, d, i
    if stats is not None:
        stats.update(queries=m, queries_sent=sent, answer_rows=int(answered), rounds=rounds,
                     rows_searched=blocks.searched)
    log.debug("knn_chunks rank %d: %d queries in %d rounds, %d forwarded", rank, m, rounds, sent)
