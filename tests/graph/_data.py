"""Graphs, partitions and features shared by the graph tests' ranks and their oracles."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from meshshard.partition import Partition, dual_graph, knn_graph, partition

NODE_IN, EDGE_IN, OUT = 4, 4, 2


def _edges(adj) -> np.ndarray:
    coo = sp.csr_matrix(adj).tocoo()
    return np.stack([coo.row, coo.col]).astype(np.int64)


def surface(cells: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell centres and the dual graph's edges of a small generated car surface."""
    from meshshard.datasets.synthetic import car_body
    from meshshard.io.geometry import cell_centres

    points, offsets, conn = car_body(cells)
    types = np.where(np.diff(offsets) == 4, 9, 5)
    adj = dual_graph(cells=conn, offsets=offsets, celltypes=types)
    return cell_centres(points, offsets, conn).astype(np.float64), _edges(adj)


def graph(kind: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(positions (N, 3), edge_index (2, E)) of a test graph."""
    rng = np.random.default_rng(seed)
    if kind == "dual":
        return surface(n)
    if kind == "knn":
        pos = rng.random((n, 3))
        return pos, _edges(knn_graph(pos, 5))
    if kind == "two":  # two components: a cloud and a separate small clump (ids n-12..n-1)
        a = rng.random((n - 12, 3))
        b = rng.random((12, 3)) * 0.1 + 5.0
        ea, eb = _edges(knn_graph(a, 5)), _edges(knn_graph(b, 3)) + (n - 12)
        return np.concatenate([a, b]), np.concatenate([ea, eb], axis=1)
    if kind == "directed":  # each node listens to its 3 nearest (not symmetric)
        from scipy.spatial import cKDTree

        pos = rng.random((n, 3))
        _, nb = cKDTree(pos).query(pos, k=4)
        dst = np.repeat(np.arange(n), 3)
        return pos, np.stack([nb[:, 1:].reshape(-1), dst]).astype(np.int64)
    raise ValueError(kind)


def make_partition(case: dict, pos: np.ndarray, edge_index: np.ndarray, P: int) -> Partition:
    method = case.get("method", "hilbert")
    n = pos.shape[0]
    if method == "metis":
        adj = sp.csr_matrix((np.ones(edge_index.shape[1]), (edge_index[0], edge_index[1])),
                            shape=(n, n))  # fmt: skip
        adj = ((adj + adj.T) > 0).astype(np.int32)
        adj.setdiag(0)
        adj.eliminate_zeros()
        return partition(pos, P, method="metis", graph=adj.tocsr())
    if method == "hilbert":
        return partition(pos, P)
    if method == "hand":  # explicit per-node shard labels (uneven, empty shards allowed)
        a = np.asarray(case["assign"](n, P), dtype=np.int64)
        key = np.random.default_rng(7).permutation(n)  # scrambled order inside shards
        return Partition.from_assignment(a, P, key=key, method="hand")
    raise ValueError(method)


def problem(case: dict, P: int) -> dict:
    """Everything a case needs, identical on every rank and in the oracle."""
    pos, ei = graph(case.get("graph", "knn"), case.get("n", 80), case.get("seed", 0))
    part = make_partition(case, pos, ei, P)
    rng = np.random.default_rng(case.get("seed", 0) + 1)
    n, e = pos.shape[0], ei.shape[1]
    x = np.concatenate([pos, rng.standard_normal((n, NODE_IN - 3))], axis=1).astype(np.float32)
    rel = pos[ei[1]] - pos[ei[0]]
    attr = np.concatenate([rel, np.linalg.norm(rel, axis=1, keepdims=True)], 1)
    weights = rng.standard_normal((n, OUT)).astype(np.float32)
    return {
        "pos": pos, "edge_index": ei, "partition": part, "x": x,
        "edge_attr": attr.astype(np.float32), "w": weights, "messages":
        rng.standard_normal((e, 3)).astype(np.float32),
    }  # fmt: skip


# hand-made layouts
def empty_and_isolated(n: int, P: int) -> np.ndarray:
    """Graph "two": the clump on rank 0 alone (no cut edges), rank 1 empty, the cloud split
    unevenly over the others (all of it on the last rank when P == 2)."""
    a = np.full(n, P - 1, dtype=np.int64)
    a[n - 12 :] = 0
    if P > 2:
        cloud = n - 12
        a[: cloud // 5] = 2  # 1 : 4 split of the cloud
    return a


def slab_uneven(n: int, P: int) -> np.ndarray:
    """Contiguous id ranges of sizes 1 : 2 : ... : P (ids are random points: scattered cuts)."""
    w = np.arange(1, P + 1, dtype=float)
    bounds = np.round(np.cumsum(w) / w.sum() * n).astype(int)
    return np.searchsorted(bounds, np.arange(n), side="right")


def first_empty(n: int, P: int) -> np.ndarray:
    """Rank 0 empty; the rest split 1 : 2 : ... by id (P == 2: rank 1 holds all, no cut)."""
    a = np.zeros(n, dtype=np.int64)
    a[:] = 1 + slab_uneven(n, P - 1) if P > 2 else 1
    return a
