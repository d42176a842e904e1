"""Build :class:`~meshshard.graph.ShardedGraph` pieces without any rank holding the whole graph.

One algorithm (:func:`_build`) runs on every rank with a transport from
:mod:`meshshard.comm.transport`:

1. every edge ``i -> j`` travels to the owner of its target ``j`` (the ownership rule);
2. ghosts of ring 1 are the non-owned sources of the owned edges; for ``rings > 1`` each rank
   asks the owners of its ring-``d`` ghosts for their in-edges (one exchange per ring);
3. ghost rows are requested from their owners, which gives every rank its send lists.

Only edges a rank owns or needs for its ghost rings ever reach it; every rank does hold the
partition (one int per node), which is what "the partition is known" means.

Length (~510 lines): the one algorithm and the constructors that feed it (edge lists, adjacency,
PyG, cells, every part at once) validate their input the same way and must change with it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from meshshard.comm.transport import DistComm, run_threads
from meshshard.graph.record import ShardedGraph
from meshshard.partition.record import HaloPlan, Partition

__all__ = ["build_all", "build_graph", "from_adjacency", "from_edge_index", "from_pyg"]

log = logging.getLogger(__name__)

_OP = "build_graph"


def _as_ids(a: Any, name: str) -> tuple[np.ndarray | None, str | None]:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    arr = np.asarray(a)
    if arr.ndim != 1:
        return None, f"{_OP}: {name} must be 1-D, got shape {arr.shape}"
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        return None, f"{_OP}: {name} must hold integer node ids, got dtype {arr.dtype}"
    return arr.astype(np.int64, copy=False), None


def _as_attr(a: Any, n: int) -> tuple[np.ndarray | None, str | None]:
    if a is None:
        return None, None
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    arr = np.asarray(a)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] != n:
        return None, f"{_OP}: edge_attr has shape {arr.shape}; expected ({n}, F), one row per edge"
    if arr.dtype.kind not in "biuf":  # kept as given (float64 stays float64): never cast
        return None, f"{_OP}: edge_attr of dtype {arr.dtype}: expected numbers (float or int)"
    return np.ascontiguousarray(arr), None


def _range_gather(ptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(ptr[r], ptr[r + 1])`` for every ``r`` in ``rows``."""
    starts, counts = ptr[rows], ptr[rows + 1] - ptr[rows]
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - np.cumsum(counts) + counts, counts)
    return shift + np.arange(total, dtype=np.int64)


def _split_by(owner: np.ndarray, size: int, *arrays: np.ndarray) -> list[list[np.ndarray]]:
    """Per array, its rows grouped by ``owner`` (stable): ``out[k][q]``."""
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(size + 1))
    out = []
    for a in arrays:
        a = a[order]
        out.append([a[bounds[q] : bounds[q + 1]] for q in range(size)])
    return out


def _build(
    comm: Any,
    partition: Partition,
    inverse: np.ndarray,
    src: Any,
    dst: Any,
    eid: Any,
    attr: Any,
    *,
    rings: int,
    symmetric: bool,
    routed: bool,
) -> ShardedGraph:
    """Per-rank builder (see the module docstring). Collective over ``comm``."""
    P, rank = comm.size, comm.rank
    n = partition.num_points
    a = partition.assignment
    off = partition.offsets
    problem = None
    if partition.nparts != P:
        problem = (
            f"{_OP}: the partition has {partition.nparts} parts but there are {P} ranks; "
            "partition into as many parts as ranks"
        )
    src_a, p1 = _as_ids(src, "src")
    dst_a, p2 = _as_ids(dst, "dst")
    eid_a, p3 = _as_ids(eid, "edge_ids")
    problem = problem or p1 or p2 or p3
    if problem is None and not (src_a.size == dst_a.size == eid_a.size):
        problem = (
            f"{_OP}: src, dst and edge_ids have {src_a.size}, {dst_a.size} and {eid_a.size} "
            f"entries on rank {rank}; give one per edge"
        )
    attr_a = None
    if problem is None:
        attr_a, problem = _as_attr(attr, src_a.size)
    if problem is None and src_a.size:
        lo = int(min(src_a.min(), dst_a.min()))
        hi = int(max(src_a.max(), dst_a.max()))
        if lo < 0 or hi >= n:
            problem = (
                f"{_OP}: rank {rank} has edges referencing nodes {lo}..{hi}, outside the graph "
                f"of {n} nodes (the partition's node count); edges must use ids 0..{n - 1}"
            )
    bad_rings = isinstance(rings, bool) or not isinstance(rings, (int, np.integer)) or rings < 1
    if problem is None and bad_rings:
        problem = f"{_OP}: rings={rings!r} must be an int >= 1"
    if problem is None and routed and src_a.size and (a[dst_a] != rank).any():
        problem = f"{_OP}: rank {rank} was given edges whose target it does not own"
    comm.flag(problem, _OP)
    widths = comm.allgather_int(-1 if attr_a is None else attr_a.shape[1])
    if len(set(widths)) > 1:
        msg = (
            f"{_OP}: ranks gave edge_attr of different widths {widths} (-1: none); give the "
            "same feature columns on every rank"
        )
        raise ValueError(msg)
    kinds = comm.allgather_int(-1 if attr_a is None else attr_a.dtype.num)
    if len(set(kinds)) > 1:
        msg = (
            f"{_OP}: ranks gave edge_attr of different dtypes (numpy type numbers {kinds}; "
            f"this rank: {None if attr_a is None else attr_a.dtype}); give one dtype on every "
            "rank"
        )
        raise ValueError(msg)
    all_rings = comm.allgather_int(rings)
    if len(set(all_rings)) > 1:
        msg = f"{_OP}: ranks asked for different rings {all_rings}; pass the same on every rank"
        raise ValueError(msg)
    width = widths[0]
    if width >= 0 and attr_a is None:
        attr_a = np.zeros((src_a.size, width), dtype=np.float32)  # (unreachable: widths agree)

    # 1. every edge to the owner of its target
    ids = np.stack([src_a, dst_a, eid_a], axis=1) if src_a.size else np.zeros((0, 3), np.int64)
    if not routed:
        owner = a[dst_a]
        groups = _split_by(owner, P, ids, *(() if attr_a is None else (attr_a,)))
        ids = np.concatenate(comm.exchange(groups[0]))
        if attr_a is not None:
            attr_a = np.concatenate(comm.exchange(groups[1]))
    src_a, dst_a, eid_a = ids[:, 0], ids[:, 1], ids[:, 2]
    # owned edges sorted by (local target, edge id)
    tgt = inverse[dst_a] - off[rank]
    o = np.lexsort((eid_a, tgt))
    src_a, dst_a, eid_a, tgt = src_a[o], dst_a[o], eid_a[o], tgt[o]
    if attr_a is not None:
        attr_a = attr_a[o]
    problem = None
    dup = eid_a.size > 1 and bool((np.diff(np.sort(eid_a)) == 0).any())
    if dup:
        problem = (
            f"{_OP}: rank {rank} received an edge id twice; every edge must be given by "
            "exactly one rank (edge ids are positions in the global edge list)"
        )
    comm.flag(problem, _OP)
    if symmetric:
        _check_symmetric(comm, a, src_a, dst_a, n)
    n_owned = int(partition.sizes[rank])
    in_ptr = np.searchsorted(tgt, np.arange(n_owned + 1))

    # 2. ghost rings, and the in-edges of ghosts closer than `rings` hops
    ghosts = np.unique(src_a[a[src_a] != rank])
    depth = np.ones(ghosts.size, dtype=np.int64)
    halo_ids: list[np.ndarray] = []
    halo_attr: list[np.ndarray] = []
    halo_depth: list[np.ndarray] = []
    frontier = ghosts
    for d in range(1, int(rings)):  # the same count on every rank (checked above)
        (req,) = _split_by(a[frontier], P, frontier)
        asked = comm.exchange(req)
        replies, rattr = [], []
        for q in range(P):
            rows = inverse[asked[q]] - off[rank]
            sel = _range_gather(in_ptr, rows)
            replies.append(np.stack([src_a[sel], dst_a[sel], eid_a[sel]], axis=1))
            if attr_a is not None:
                rattr.append(attr_a[sel])
        got = np.concatenate(comm.exchange(replies))
        if attr_a is not None:
            halo_attr.append(np.concatenate(comm.exchange(rattr)))
        halo_ids.append(got)
        halo_depth.append(np.full(got.shape[0], d, dtype=np.int64))
        new = np.unique(got[:, 0])
        new = new[(a[new] != rank) & ~np.isin(new, ghosts)]
        frontier = new
        ghosts = np.concatenate([ghosts, new])
        depth = np.concatenate([depth, np.full(new.size, d + 1, dtype=np.int64)])

    # 3. ghost order (by stored row = by owner, then row) and the send lists
    g_stored = inverse[ghosts]
    o = np.argsort(g_stored, kind="stable")
    ghosts, depth, g_stored = ghosts[o], depth[o], g_stored[o]
    (req,) = _split_by(a[ghosts], P, g_stored)
    local_req = [r - off[q] for q, r in enumerate(req)]
    asked = comm.exchange(local_req)
    send_idx = np.concatenate(asked).astype(np.int64)
    send_ptr = np.concatenate([[0], np.cumsum([x.size for x in asked])]).astype(np.int64)
    recv_ptr = np.searchsorted(g_stored, off).astype(np.int64)
    empty_ptr = np.zeros(P + 1, dtype=np.int64)
    empty_idx = np.zeros(0, dtype=np.int64)
    plan = HaloPlan(
        offsets=off,
        send_ptr=tuple(send_ptr if q == rank else empty_ptr for q in range(P)),
        send_idx=tuple(send_idx if q == rank else empty_idx for q in range(P)),
        recv_ptr=tuple(recv_ptr if q == rank else empty_ptr for q in range(P)),
        recv_idx=tuple(g_stored.astype(np.int64) if q == rank else empty_idx for q in range(P)),
        kind="graph-rank-view",
        params={"rings": int(rings), "rank": rank},
    )

    # 4. local numbering: owned rows, then ghosts
    def local(v: np.ndarray) -> np.ndarray:
        s = inverse[v]
        mine = a[v] == rank
        out = np.empty(v.size, dtype=np.int64)
        out[mine] = s[mine] - off[rank]
        out[~mine] = n_owned + np.searchsorted(g_stored, s[~mine])
        return out

    all_ids = [np.stack([src_a, dst_a, eid_a], axis=1), *halo_ids]
    ids = np.concatenate(all_ids) if all_ids else np.zeros((0, 3), np.int64)
    e_depth = np.concatenate([np.zeros(src_a.size, dtype=np.int64), *halo_depth])
    ls, ld = local(ids[:, 0]), local(ids[:, 1])
    o = np.lexsort((ids[:, 2], ld, e_depth))
    edge_index = torch.from_numpy(np.stack([ls[o], ld[o]]).astype(np.int64))
    edge_attr = None
    if attr_a is not None:
        edge_attr = torch.from_numpy(np.concatenate([attr_a, *halo_attr])[o])
    owned_nodes = partition.order[off[rank] : off[rank + 1]]
    return ShardedGraph(
        rank=rank,
        nparts=P,
        num_nodes=n,
        sizes=np.asarray(partition.sizes, dtype=np.int64),
        nodes=np.concatenate([owned_nodes, ghosts]).astype(np.int64),
        ghost_depth=depth,
        edge_index=edge_index,
        edge_ids=ids[o, 2].copy(),
        n_owned_edges=int(src_a.size),
        plan=plan,
        rings=int(rings),
        edge_attr=edge_attr,
        group=comm.group,
    )


def _check_symmetric(comm: Any, a: np.ndarray, src: np.ndarray, dst: np.ndarray, n: int) -> None:
    """Every edge ``i -> j`` must have its reverse ``j -> i`` (held by the owner of ``i``)."""
    nn = np.int64(max(n, 1))
    (parts,) = _split_by(a[src], comm.size, dst * nn + src)  # key of the reverse edge
    asked = np.concatenate(comm.exchange(parts))
    mine = src * nn + dst
    missing = asked[~np.isin(asked, mine)]
    problem = None
    if missing.size:
        i, j = int(missing[0] // nn), int(missing[0] % nn)
        problem = (
            f"{_OP}: the graph is not symmetric but symmetric=True: {missing.size} edge(s) lack "
            f"their reverse, e.g. {j} -> {i} exists but {i} -> {j} does not; add the reverse "
            "edges (e.g. torch_geometric.utils.to_undirected) or pass symmetric=False"
        )
    comm.flag(problem, _OP)


def _prepare(partition: Any) -> tuple[Partition, np.ndarray]:
    if not isinstance(partition, Partition):
        msg = f"{_OP}: partition must be a meshshard Partition, got {type(partition).__name__}"
        raise TypeError(msg)
    return partition, partition.inverse


def build_graph(partition: Partition, src: Any, dst: Any, *, edge_ids: Any = None,
                edge_attr: Any = None, rings: int = 1, symmetric: bool = False,
                group: Any = None) -> ShardedGraph:  # fmt: skip
    """This rank's :class:`ShardedGraph` from the edges this rank was given.

    Every rank passes *some* edges (any split of the edge list: a slice read from a file, the
    edges of its cells, ...); together they must give every edge exactly once. Edges are routed
    to the owner of their target, ghosts and send lists are agreed with the owners. No rank
    ever holds the whole edge list.

    Collective: every rank of ``group`` must call this.

    Parameters
    ----------
    partition : Partition
        Of the graph's nodes, with as many parts as ranks (the same on every rank).
    src, dst : array of shape (E_r,), int
        Original (global) node ids of this rank's edges ``src -> dst``.
    edge_ids : array of shape (E_r,), int, optional
        Position of every edge in the global edge list (aligns per-edge features). Default:
        rank ``r``'s edges follow rank ``r - 1``'s (one all-gather of counts).
    edge_attr : array of shape (E_r, F), optional
        Per-edge features (any float or integer dtype, kept as given; the same dtype on every
        rank), carried with the edges.
    rings : int
        Ghost layers (1 for a refresh per layer; L for one refresh before L layers).
    symmetric : bool
        Require every edge's reverse to exist (checked collectively).

    Returns
    -------
    ShardedGraph

    Raises
    ------
    ValueError
        On every rank: node ids outside the partition's node count, a partition with another
        number of parts than ranks, mismatched lengths, an edge given twice, a graph that is
        not symmetric when ``symmetric=True``.
    """
    partition, inverse = _prepare(partition)
    comm = DistComm(group)
    if edge_ids is None:
        src_a, problem = _as_ids(src, "src")
        counts = comm.allgather_int(-1 if problem else src_a.size)
        start = sum(max(c, 0) for c in counts[: comm.rank])
        edge_ids = np.arange(start, start + max(counts[comm.rank], 0), dtype=np.int64)
    return _build(
        comm, partition, inverse, src, dst, edge_ids, edge_attr,
        rings=rings, symmetric=symmetric, routed=False,
    )  # fmt: skip


def _owned_slice(partition: Partition, rank: int, src, dst, edge_attr):
    src_a, p1 = _as_ids(src, "src")
    dst_a, p2 = _as_ids(dst, "dst")
    if p1 or p2 or src_a.size != dst_a.size:
        return src, dst, np.arange(np.shape(src)[0] if np.ndim(src) else 0), edge_attr, False
    n = partition.num_points
    ok = (dst_a >= 0) & (dst_a < n) & (src_a >= 0) & (src_a < n)
    if not ok.all():
        return src, dst, np.arange(src_a.size), edge_attr, False
    sel = np.flatnonzero(partition.assignment[dst_a] == rank)
    attr = edge_attr
    if edge_attr is not None:
        attr_a = edge_attr if isinstance(edge_attr, torch.Tensor) else np.asarray(edge_attr)
        if attr_a.shape[0] == src_a.size:
            attr = attr_a[sel]
        else:
            return src, dst, np.arange(src_a.size), edge_attr, False
    return src_a[sel], dst_a[sel], sel.astype(np.int64), attr, True


def from_edge_index(
    partition: Partition,
    edge_index: Any,
    *,
    edge_attr: Any = None,
    rings: int = 1,
    symmetric: bool = False,
    group: Any = None,
) -> ShardedGraph:
    """This rank's :class:`ShardedGraph` from the *whole* edge list (held by every rank).

    For small cases and tests; :func:`build_graph` is the scalable path. Each rank keeps the
    edges whose target it owns (no routing), then agrees ghosts with the owners.

    Collective: every rank of ``group`` must call this.

    Parameters
    ----------
    edge_index : array or Tensor of shape (2, E)
        ``[source, target]`` original node ids (PyG's convention).
    edge_attr : array of shape (E, F), optional
    rings, symmetric, group
        As in :func:`build_graph`.
    """
    partition, inverse = _prepare(partition)
    comm = DistComm(group)
    src, dst = _edge_rows(edge_index)
    s, d, eid, attr, routed = _owned_slice(partition, comm.rank, src, dst, edge_attr)
    return _build(
        comm, partition, inverse, s, d, eid, attr,
        rings=rings, symmetric=symmetric, routed=routed,
    )  # fmt: skip


def _edge_rows(edge_index: Any) -> tuple[Any, Any]:
    ei = edge_index
    if isinstance(ei, torch.Tensor):
        ei = ei.detach().cpu().numpy()
    ei = np.asarray(ei)
    if ei.ndim != 2 or ei.shape[0] != 2:
        msg = f"{_OP}: edge_index must have shape (2, E) ([source, target]); got {ei.shape}"
        raise ValueError(msg)
    return ei[0], ei[1]


def from_adjacency(
    partition: Partition,
    adjacency: Any,
    *,
    rings: int = 1,
    symmetric: bool = True,
    group: Any = None,
) -> ShardedGraph:
    """This rank's graph from a whole scipy.sparse adjacency (e.g.
    :func:`meshshard.partition.dual_graph` or :func:`~meshshard.partition.knn_graph`).

    Entry ``(i, j)`` is the edge ``i -> j``; edge ids are the CSR positions. Collective.
    """
    import scipy.sparse as sp

    if not sp.issparse(adjacency):
        msg = f"{_OP}: adjacency must be a scipy.sparse matrix, got {type(adjacency).__name__}"
        raise TypeError(msg)
    n = partition.num_points
    if adjacency.shape != (n, n):
        msg = (
            f"{_OP}: the adjacency is {adjacency.shape[0]} x {adjacency.shape[1]} but the "
            f"partition has {n} nodes; partition the same graph"
        )
        raise ValueError(msg)
    coo = sp.csr_matrix(adjacency).tocoo()
    return from_edge_index(
        partition, np.stack([coo.row, coo.col]), rings=rings, symmetric=symmetric, group=group
    )


def from_pyg(
    data: Any,
    partition: Partition,
    *,
    rings: int = 1,
    symmetric: bool = False,
    group: Any = None,
) -> ShardedGraph:
    """This rank's graph from a ``torch_geometric.data.Data`` (its ``edge_index`` and, when
    present, ``edge_attr``). ``data.num_nodes`` must equal the partition's node count.
    Collective."""
    num = getattr(data, "num_nodes", None)
    if num is None or int(num) != partition.num_points:
        msg = (
            f"{_OP}: the Data has {num} nodes but the partition has {partition.num_points}; "
            "partition the same graph"
        )
        raise ValueError(msg)
    return from_edge_index(
        partition,
        data.edge_index,
        edge_attr=getattr(data, "edge_attr", None),
        rings=rings,
        symmetric=symmetric,
        group=group,
    )


def build_all(
    partition: Partition,
    edge_index: Any,
    *,
    edge_attr: Any = None,
    rings: int = 1,
    symmetric: bool = False,
) -> list[ShardedGraph]:
    """Every part's :class:`ShardedGraph`, built in this process (no process group).

    Runs the same per-rank algorithm as :func:`build_graph`, one thread per part; for
    preprocessing (:mod:`meshshard.datasets.graphstore`) and tests. The pieces have
    ``group=None``.

    Examples
    --------
    >>> import numpy as np
    >>> from meshshard.partition import Partition
    >>> part = Partition.from_assignment(np.array([0, 0, 1, 1]), 2)
    >>> path = np.array([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])  # 0 - 1 - 2 - 3, both ways
    >>> g0, g1 = build_all(part, path, symmetric=True)
    >>> g0.nodes.tolist(), g0.edge_index.tolist()  # owned 0, 1; ghost 2 (the edge 2 -> 1)
    ([0, 1, 2], [[1, 0, 2], [0, 1, 1]])
    >>> g1.nodes.tolist(), g1.n_owned_edges, g1.plan.recv_idx[1].tolist()
    ([2, 3, 1], 3, [1])
    """
    partition, inverse = _prepare(partition)
    src, dst = _edge_rows(edge_index)

    def one(comm: Any) -> ShardedGraph:
        s, d, eid, attr, routed = _owned_slice(partition, comm.rank, src, dst, edge_attr)
        return _build(
            comm, partition, inverse, s, d, eid, attr,
            rings=rings, symmetric=symmetric, routed=routed,
        )  # fmt: skip

    return run_threads(one, partition.nparts)
