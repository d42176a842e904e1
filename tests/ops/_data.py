"""Deterministic point clouds, layouts and single-process oracles for the ops tests."""

from __future__ import annotations

import numpy as np
import torch

from meshshard.partition.record import Partition


def cloud(n: int, kind: str = "uniform", seed: int = 0, d: int = 3) -> np.ndarray:
    """``uniform`` in the unit cube, ``clustered`` (a few tight Gaussian blobs plus a dense
    thin layer), or ``dupes`` (points on a coarse grid with repeats: exact distance ties)."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.random((n, d))
    if kind == "clustered":
        centres = rng.random((4, d))
        lab = rng.integers(0, 4, n)
        pts = centres[lab] + rng.normal(scale=0.01, size=(n, d))
        layer = rng.random(n) < 0.3
        pts[layer, -1] = 0.5 + rng.normal(scale=1e-3, size=layer.sum())
        return pts
    if kind == "dupes":
        return rng.integers(0, 4, (n, d)).astype(np.float64)
    raise ValueError(kind)


def layout(points: np.ndarray, sizes: list[int] | None, method: str, parts: int) -> Partition:
    """A partition with exactly ``sizes`` (or the method's own sizes when None).

    ``slab``: sorted by the first coordinate then cut (compact shards); ``random``: shuffled
    then cut (every shard spans the whole domain: the worst case for region pruning);
    ``morton`` / ``hilbert`` / ``rcb`` / ``metis``: :func:`meshshard.partition.partition`.
    """
    n = points.shape[0]
    if method in ("slab", "random"):
        if method == "slab":
            order = np.lexsort((np.arange(n), points[:, 0]))
        else:
            order = np.random.default_rng(1).permutation(n)
        assert sizes is not None and sum(sizes) == n
        assignment = np.empty(n, dtype=np.int64)
        assignment[order] = np.repeat(np.arange(parts), sizes)
        key = np.empty(n, dtype=np.int64)
        key[order] = np.arange(n)
        return Partition.from_assignment(assignment, parts, key=key, method=method)
    from meshshard.partition import partition

    return partition(points, parts, method=method)


def oracle_knn(x: np.ndarray, y: np.ndarray, k: int, exclude_self: bool = False):
    """Brute force float64, sorted by (distance, index)."""
    d2 = ((y[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    if exclude_self:
        np.fill_diagonal(d2, np.inf)
    idx = np.broadcast_to(np.arange(x.shape[0]), d2.shape)
    o = np.lexsort((idx, d2), axis=-1)[:, :k]
    return np.take_along_axis(idx, o, 1)


def oracle_radius(x: np.ndarray, y: np.ndarray, r: float, exclude_self=False, cap=None):
    """Lists of indices within r, sorted by (distance, index)."""
    d = np.sqrt(((y[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    out = []
    for i in range(y.shape[0]):
        js = np.nonzero(d[i] <= r)[0]
        if exclude_self:
            js = js[js != i]
        js = js[np.lexsort((js, d[i, js]))]
        out.append(js[:cap] if cap is not None else js)
    return out


def torch_dist(y: torch.Tensor, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Differentiable single-process distances for an index matrix (-1 -> inf)."""
    safe = idx.clamp_min(0)
    d = torch.linalg.vector_norm(y[:, None, :] - x[safe], dim=-1)
    return torch.where(idx >= 0, d, torch.full_like(d, float("inf")))


def knn_halo_plan(stored: np.ndarray, sizes: list[int], k: int = 3):
    """A HaloPlan whose ghosts are every shard's off-shard kNN neighbours (sorted)."""
    from meshshard.partition.record import HaloPlan

    P = len(sizes)
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    nbr = oracle_knn(stored, stored, k)
    owner = np.searchsorted(off[1:], np.arange(off[-1]), side="right")
    recv_idx, recv_ptr = [], []
    for p in range(P):
        g = np.unique(nbr[off[p] : off[p + 1]].reshape(-1))
        g = g[owner[g] != p]  # sorted global ids are grouped by owner in increasing order
        recv_idx.append(g)
        recv_ptr.append(np.concatenate([[0], np.cumsum(np.bincount(owner[g], minlength=P))]))
    send_idx, send_ptr = [], []
    for p in range(P):
        parts = [recv_idx[q][recv_ptr[q][p] : recv_ptr[q][p + 1]] - off[p] for q in range(P)]
        send_idx.append(np.concatenate(parts).astype(np.int64))
        send_ptr.append(np.concatenate([[0], np.cumsum([len(a) for a in parts])]).astype(np.int64))
    plan = HaloPlan(
        off,
        tuple(send_ptr),
        tuple(send_idx),
        tuple(recv_ptr),
        tuple(recv_idx),
        kind="knn",
        params={"k": k},
    )
    plan.validate()
    return plan
