"""Distributed neighbour queries on plain local tensors and a process group.

This is the lower layer of :mod:`meshshard.ops`: every function takes this rank's rows
(``x`` of shape ``(n_local, d)``) and a process group, and answers exactly as a single process
would on the rows of all ranks concatenated in rank order ("stored order"). A *global index*
is a row's position in that order: ``offset[rank] + local_row``.

Algorithm (no ring, no all-gather of points):

1. One ``all_gather`` of a small metadata row per rank validates the inputs on every rank at
   once and yields every rank's row count.
2. One ``all_gather`` of each rank's region: up to ``nboxes`` boxes around contiguous runs of
   its rows (see :mod:`meshshard.ops._regions`).
3. kNN: a local kNN gives each query a bound (its k-th distance, or a bound from the boxes
   when the local shard holds fewer than k points); each query is forwarded only to ranks
   with a box within that bound; those ranks answer with their local k nearest (distance,
   global index, coordinates); the querier merges and keeps the k best by (distance, index).
   Radius: every rank sends each other rank the points within ``r`` of that rank's query
   boxes, then queries locally.
4. Returned distances are recomputed with torch from the selected coordinates, so they are
   differentiable w.r.t. ``x`` (on every rank: coordinates travel through a differentiable
   all-to-all and their gradients go back and sum at the owner) and ``y``.

Every function here is collective (forward, and backward when gradients are used).
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import torch
import torch.distributed as dist

from meshshard.comm.check import check_collective
from meshshard.comm.rows import all_gather_rows, all_to_all
from meshshard.ops import kernels
from meshshard.ops._knn_merge import (
    _drop_self,
    _lexsort3,
    answer_knn_queries,
    forward_and_merge,
    route,
)
from meshshard.ops._regions import (
    knn_bound_from_boxes,
    near_ranks,
    near_ranks_dense,
    shard_boxes,
)
from meshshard.ops._validation import check_points

__all__ = ["knn", "knn_graph", "radius", "radius_graph"]

log = logging.getLogger(__name__)

Flow = Literal["source_to_target", "target_to_source"]


def _check_flow(flow: str) -> None:
    if flow not in ("source_to_target", "target_to_source"):
        msg = f"flow={flow!r} must be 'source_to_target' or 'target_to_source'"
        raise ValueError(msg)


def _check_nboxes(nboxes: int) -> None:
    if isinstance(nboxes, bool) or not isinstance(nboxes, int) or nboxes < 1:
        msg = f"nboxes={nboxes!r} must be an int >= 1"
        raise ValueError(msg)


def knn(
    x: torch.Tensor,
    k: int,
    y: torch.Tensor | None = None,
    *,
    loop: bool = True,
    group: dist.ProcessGroup | None = None,
    x_sizes: list[int] | tuple[int, ...] | None = None,
    backend: str = "auto",
    nboxes: int = 16,
    stats: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest neighbours over all ranks.

    Collective: every rank of ``group`` must call this (and ``backward`` when gradients flow).

    Host syncs (the device path, ``backend="grid"``): 5 per call, none in the backward -- the
    input check's one read-back (which also brings every shard's bounds), the local search's
    two passes, the forwarded queries' counts and the answers' one pass. ``stats`` adds one.

    Parameters
    ----------
    x : Tensor of shape (n_local, d)
        This rank's points (any floating dtype, any device; may be empty).
    k : int
        Neighbours per query, ``1 <= k <= N`` (``N - 1`` when ``loop=False``).
    y : Tensor of shape (m_local, d), optional
        This rank's queries; default ``x``.
    loop : bool
        With ``y=None``: ``False`` excludes each point itself (other points at distance 0
        still count).
    group : ProcessGroup, optional
        Default: the default group.
    x_sizes : sequence of int, optional
        Every rank's row count of ``x``; checked when given (they are learnt anyway).
    backend : {"auto", "kdtree", "grid", "brute", "cluster"}
        Local kernel (:mod:`meshshard.ops.kernels`).
    nboxes : int
        Boxes per rank describing its region (more boxes prune better on non-compact shards).
    stats : dict, optional
        Filled with traffic counters: ``queries_sent``, ``answer_rows``, ``queries``.

    Returns
    -------
    dist : Tensor of shape (m_local, k), dtype of ``x``
        Distances, ascending; differentiable w.r.t. ``x`` (all ranks) and ``y``.
    index : Tensor of shape (m_local, k), int64
        Global indices (stored order) of the neighbours; ties broken by the lower index.

    Raises
    ------
    ValueError, TypeError
        On every rank, when any rank's input is invalid (see :mod:`._validation`).

    Example
    -------
    >>> d, i = knn(x_local, 8)  # doctest: +SKIP
    """
    d, i, _ = _knn(
        x,
        k,
        y,
        loop=loop,
        group=group,
        x_sizes=x_sizes,
        backend=backend,
        nboxes=nboxes,
        stats=stats,
    )
    return d, i


def _grid_bounds(be: str, b) -> tuple | None:
    """A box for the cell list from the bounds the input check brought (no read-back)."""
    if be != "grid" or not b or not all(map(math.isfinite, (*b[0], *b[1]))):
        return None
    return b


def _near(be: str):
    # the CPU tree path keeps the run-pruned test (fewer flops, a few syncs); the device
    # backends the dense one (no sync)
    return near_ranks if be == "kdtree" else near_ranks_dense


def _knn(x, k, y, *, loop, group, x_sizes, backend, nboxes, stats):
    _check_nboxes(nboxes)
    meta = check_points(x, y, group=group, op="knn", k=k, loop=loop, x_sizes=x_sizes)
    rank = dist.get_rank(group)
    offset = meta.x_offsets[rank]
    yq = x if y is None else y
    m, n, device = yq.shape[0], x.shape[0], x.device
    be = kernels.resolve_backend(backend, device)

    # phase 1: local answer and bound
    exclude_self = y is None and not loop
    kk = k + 1 if exclude_self else k
    index = kernels.KnnIndex(x, backend=be, bounds=_grid_bounds(be, meta.x_bounds[rank]))
    d2_loc, i_loc = index.query(yq, kk)
    if exclude_self:
        d2_loc, i_loc = _drop_self(d2_loc, i_loc, k, torch.arange(m, device=device))
    bound2 = d2_loc[:, k - 1] if m else torch.empty(0, dtype=torch.float64, device=device)

    boxes = all_gather_rows(shard_boxes(x, nboxes), group)  # (P, B, 2d+1), stays on device
    if n < kk and m:  # the local shard cannot bound every query: a bound from all boxes
        # (a box bound must count k points besides the query itself when loop=False)
        far = knn_bound_from_boxes(yq, boxes.reshape(-1, boxes.shape[-1]), kk)
        bound2 = torch.where(torch.isinf(bound2), far, bound2)
    mask = _near(be)(yq, bound2, boxes, rank)  # (m, P)

    dist_out, index_out, sent, answered = forward_and_merge(
        x, yq, d2_loc, i_loc, bound2, mask, k=k, offset=offset, group=group,
        answer=lambda q, _: answer_knn_queries(x, q, k, index=index),
    )
    if stats is not None:  # reading the count back is a host sync: only when asked
        stats.update(queries=m, queries_sent=sent, answer_rows=int(answered))
    log.debug("knn rank %d: %d queries, %d forwarded", rank, m, sent)
    return dist_out, index_out, offset


def _check_cap(max_num_neighbors, op: str) -> None:
    if max_num_neighbors is not None and (
        isinstance(max_num_neighbors, bool)
        or not isinstance(max_num_neighbors, int)
        or max_num_neighbors < 1
    ):
        msg = f"{op}: max_num_neighbors={max_num_neighbors!r} must be None or an int >= 1"
        raise ValueError(msg)


def _radius_pool(x, r, y, *, group, backend, nboxes, op):
    """This rank's points plus the other ranks' points within ``r`` of its query boxes.
    Returns ``(yq, pool, pool_g, offset, be, bounds, stats)``; two host syncs (the input
    check and the import counts)."""
    _check_nboxes(nboxes)
    meta = check_points(x, y, group=group, op=op, r=r)
    rank = dist.get_rank(group)
    offset = meta.x_offsets[rank]
    yq = x if y is None else y
    n, device = x.shape[0], x.device
    be = kernels.resolve_backend(backend, device)

    boxes = all_gather_rows(shard_boxes(yq, nboxes), group)  # stays on the device
    lim = (float(r) * (1 + 1e-9)) ** 2
    reach2 = torch.full((1,), lim, dtype=torch.float64, device=device)
    smask = _near(be)(x, reach2.expand(n), boxes, rank)  # (n, P)
    send, recv, rows, _, _ = route(smask, group)
    imp_xyz = all_to_all(x[rows], send, recv, group)  # differentiable
    imp_g = all_to_all(rows + offset, send, recv, group)
    pool = torch.cat([x, imp_xyz])
    pool_g = torch.cat([torch.arange(n, device=device) + offset, imp_g])
    # the pool lies in this rank's points' box and its queries' box grown by r
    (xlo, xhi), (ylo, yhi) = meta.x_bounds[rank], meta.y_bounds[rank]
    pad = float(r) * (1 + 1e-6)
    box = ([min(a, b - pad) for a, b in zip(xlo, ylo)], [max(a, b + pad) for a, b in zip(xhi, yhi)])
    stats = {"points_sent": sum(send), "points_received": sum(recv)}
    return yq, pool, pool_g, offset, be, _grid_bounds(be, box), stats


def _radius_csr(
    x: torch.Tensor,
    r: float,
    y: torch.Tensor | None,
    *,
    max_num_neighbors: int | None,
    loop: bool,
    group: dist.ProcessGroup | None,
    backend: str,
    nboxes: int,
    stats: dict | None,
    op: str,
    compact: bool = True,
):
    """CSR neighbour lists ``(ptr, g, dist, row, pos, offset, valid)``; with ``compact=False``
    the excluded entries (self, past the cap) stay, marked by ``valid`` (no host sync)."""
    _check_cap(max_num_neighbors, op)
    yq, pool, pool_g, offset, be, bounds, st = _radius_pool(
        x, r, y, group=group, backend=backend, nboxes=nboxes, op=op)
    m, device = yq.shape[0], x.device
    ptr, col, d2 = kernels.radius(pool, yq, r, backend=be, key=pool_g, bounds=bounds)
    E = col.numel()
    row = torch.repeat_interleave(torch.arange(m, device=device), torch.diff(ptr), output_size=E)
    g = pool_g[col]
    if be != "grid":  # the grid orders ties by global index already
        o = _lexsort3(row, d2, g)  # ties by global index, not by pool position
        row, col, g = row[o], col[o], g[o]
    pos = torch.arange(E, device=device) - ptr[row]
    valid = torch.ones(E, dtype=torch.bool, device=device)
    if y is None and not loop:  # drop the point itself: at most one entry per row
        is_self = g == row + offset
        big = torch.iinfo(torch.int64).max
        self_pos = torch.full((m,), big, dtype=torch.int64, device=device)
        self_pos = self_pos.scatter_reduce(0, row, torch.where(is_self, pos, big), "amin")
        pos = pos - (pos > self_pos[row]).long()
        valid = ~is_self
    if max_num_neighbors is not None:  # keep the closest ones
        valid = valid & (pos < max_num_neighbors)
    if compact and ((y is None and not loop) or max_num_neighbors is not None):
        keep = torch.nonzero(valid).flatten()  # host sync: the lists' length
        row, col, g, pos = row[keep], col[keep], g[keep], pos[keep]
        valid = valid[keep]
    counts = torch.zeros(m, dtype=torch.int64, device=device).index_add_(0, row, valid.long())
    out_ptr = torch.zeros(m + 1, dtype=torch.int64, device=device)
    out_ptr[1:] = torch.cumsum(counts, 0)
    dist_out = torch.linalg.vector_norm(yq[row] - pool[col], dim=-1)
    if stats is not None:
        stats.update(queries=m, **st)
    return out_ptr, g, dist_out, row, pos, offset, valid


def _radius_capped(x, r, y, *, width, loop, group, backend, nboxes, stats, op):
    """Static shape: the closest ``width`` of every query, ``(dist, index)`` (m, width)."""
    yq, pool, pool_g, offset, be, bounds, st = _radius_pool(
        x, r, y, group=group, backend=backend, nboxes=nboxes, op=op)
    m, device = yq.shape[0], x.device
    exclude_self = y is None and not loop
    w = width + 1 if exclude_self else width
    _, pos = kernels.radius_padded(pool, yq, r, w, backend=be, key=pool_g, bounds=bounds)
    g = torch.where(pos >= 0, pool_g[pos.clamp_min(0)], -1)
    if exclude_self:
        is_self = g == (torch.arange(m, device=device) + offset)[:, None]
        o = torch.argsort(is_self.to(torch.int8), dim=1, stable=True)[:, :width]
        pos, g = pos.gather(1, o), g.gather(1, o)
    if pool.shape[0]:
        nbr = pool[pos.clamp_min(0)]
    else:  # keep the imports in the graph: their backward all-to-all is collective
        nbr = yq.new_zeros((m, width, yq.shape[1])) + pool.sum()
    d = torch.linalg.vector_norm(yq[:, None, :] - nbr, dim=-1)
    if stats is not None:
        stats.update(queries=m, **st)
    return torch.where(pos >= 0, d, float("inf")), g


def radius(
    x: torch.Tensor,
    r: float,
    y: torch.Tensor | None = None,
    *,
    max_num_neighbors: int | None = None,
    loop: bool = True,
    format: Literal["padded", "csr"] = "padded",
    group: dist.ProcessGroup | None = None,
    backend: str = "auto",
    nboxes: int = 16,
    stats: dict | None = None,
):
    """Exact ball query over all ranks: every point within ``r`` (``<= r``), nearest first.

    Collective: every rank of ``group`` must call this (and ``backward`` when gradients flow).

    Host syncs (the device path, ``backend="grid"``): ``format="padded"`` with
    ``max_num_neighbors`` is static-shaped, 3 per call (the input check, the imported points'
    counts, the search's width); without the cap 5 (also the compaction and the padded width);
    ``"csr"`` 4, or 5 when entries are dropped (``loop=False``, a cap). None in the backward.

    Parameters
    ----------
    x : Tensor of shape (n_local, d)
        This rank's points.
    r : float
        Radius (> 0).
    y : Tensor of shape (m_local, d), optional
        This rank's queries; default ``x``.
    max_num_neighbors : int, optional
        Cap per query; the *closest* ones are kept (ties by index), unlike torch_cluster.
    loop : bool
        With ``y=None``: ``False`` excludes each point itself.
    format : {"padded", "csr"}
        ``"padded"`` returns ``(dist, index)`` of shape (m_local, W) padded with ``inf`` / ``-1``,
        ``W = max_num_neighbors`` when given, else the largest count over all ranks (one
        extra all_reduce). ``"csr"`` returns ``(ptr, index, dist)``: ``ptr`` (m_local + 1,),
        ``index`` and ``dist`` (E,).
    group, backend, nboxes, stats
        As in :func:`knn`.

    Returns
    -------
    tuple of Tensors
        See ``format``. Indices are global (stored order); distances are differentiable.
    """
    if format not in ("padded", "csr"):
        msg = f"radius: format={format!r} must be 'padded' or 'csr'"
        raise ValueError(msg)
    _check_cap(max_num_neighbors, "radius")
    if format == "padded" and max_num_neighbors is not None:
        return _radius_capped(x, r, y, width=max_num_neighbors, loop=loop, group=group,
                              backend=backend, nboxes=nboxes, stats=stats, op="radius")
    ptr, g, d, row, pos, _, valid = _radius_csr(
        x,
        r,
        y,
        max_num_neighbors=max_num_neighbors,
        loop=loop,
        group=group,
        backend=backend,
        nboxes=nboxes,
        stats=stats,
        op="radius",
        compact=format == "csr",
    )
    if format == "csr":
        return ptr, g, d
    m = ptr.numel() - 1
    w = torch.diff(ptr).max().reshape(1) if m else torch.zeros(1, dtype=torch.int64,
                                                                device=ptr.device)
    check_collective("all_reduce", group, w, detail="max: radius width")
    dist.all_reduce(w, op=dist.ReduceOp.MAX, group=group)
    width = int(w)  # host sync: the padded width
    at = torch.where(valid, pos, width)  # excluded entries go to a dropped column
    idx = torch.full((m, width + 1), -1, dtype=torch.int64, device=ptr.device)
    idx[row, at] = g
    dd = torch.full((m, width + 1), float("inf"), dtype=d.dtype, device=ptr.device)
    dd = dd.index_put((row, at), d)
    return dd[:, :width], idx[:, :width]


def knn_graph(
    x: torch.Tensor,
    k: int,
    loop: bool = False,
    flow: Flow = "source_to_target",
    *,
    group: dist.ProcessGroup | None = None,
    backend: str = "auto",
    nboxes: int = 16,
) -> torch.Tensor:
    """k-nearest-neighbour graph edges of this rank's points, torch_cluster's convention.

    Collective: every rank of ``group`` must call this.

    Parameters
    ----------
    x : Tensor of shape (n_local, d)
    k : int
    loop : bool
        Include self-loops (default ``False``: exactly ``k`` other points per centre).
    flow : {"source_to_target", "target_to_source"}
        ``"source_to_target"`` (default): row 0 = neighbour (source), row 1 = centre
        (target); ``"target_to_source"``: row 0 = centre, row 1 = neighbour.

    Returns
    -------
    Tensor of shape (2, n_local * k), int64
        Global indices; this rank's edges are those whose centre is one of its points.
    """
    _check_flow(flow)
    _, index, offset = _knn(
        x,
        k,
        None,
        loop=loop,
        group=group,
        x_sizes=None,
        backend=backend,
        nboxes=nboxes,
        stats=None,
    )
    centre = (torch.arange(x.shape[0], device=x.device) + offset).repeat_interleave(k)
    nbr = index.reshape(-1)
    return torch.stack([nbr, centre] if flow == "source_to_target" else [centre, nbr])


def radius_graph(
    x: torch.Tensor,
    r: float,
    loop: bool = False,
    max_num_neighbors: int | None = None,
    flow: Flow = "source_to_target",
    *,
    group: dist.ProcessGroup | None = None,
    backend: str = "auto",
    nboxes: int = 16,
) -> torch.Tensor:
    """Radius graph edges of this rank's points, torch_cluster's convention.

    Collective: every rank of ``group`` must call this.

    ``max_num_neighbors`` (default ``None``: no cap; torch_cluster's default is 32) keeps the
    closest neighbours after excluding the point itself, so no centre gets more than the cap.

    Returns
    -------
    Tensor of shape (2, E_local), int64
        Global indices; row order as in :func:`knn_graph` for ``flow``; edges grouped by
        centre, nearest first.
    """
    _check_flow(flow)
    _, g, _, row, _, offset, _ = _radius_csr(
        x,
        r,
        None,
        max_num_neighbors=max_num_neighbors,
        loop=loop,
        group=group,
        backend=backend,
        nboxes=nboxes,
        stats=None,
        op="radius_graph",
    )
    centre = row + offset
    return torch.stack([g, centre] if flow == "source_to_target" else [centre, g])
