"""Local (single-shard) neighbour kernels behind one interface.

Every kernel answers the same question the same way, so backends are interchangeable:

- :func:`knn` returns, for each query row of ``y``, the ``k`` nearest rows of ``x`` sorted by
  (distance, index) — ties broken by the lower index — padded with ``inf`` / ``-1`` when ``x`` has
  fewer than ``k`` rows.
- :func:`radius` returns CSR lists of all rows of ``x`` within ``r`` (``<= r``) of each query,
  each list sorted by (distance, index).

Selection distances are recomputed here in float64 from the coordinates with one formula
(:func:`sqdist`), whichever backend found the candidates; that makes rankings and ties
identical across backends and across ranks. They are not differentiable: the distributed ops
recompute differentiable distances from the selected coordinates.

Backends
--------
``"kdtree"``  scipy ``cKDTree`` (CPU; CUDA inputs are moved to the CPU and back), queried with
              ``torch.get_num_threads()`` workers: the process's thread budget, so that P ranks
              on one node (torchrun sets ``OMP_NUM_THREADS``) do not each start one thread per
              core.
``"grid"``    a uniform-grid cell list in torch on the tensors' device
              (:class:`meshshard.ops.cell_index.CellIndex`): no O(n * m) scan, no loop per
              tile; a few host syncs per query (its docstring counts them).
``"brute"``   tiled torch brute force on the tensors' device (CPU or GPU).
``"cluster"`` ``torch_cluster`` when installed (``pip install -e '.[cluster]'``).
``"auto"``    ``"kdtree"`` on CPU, ``"grid"`` on any other device.
"""

from __future__ import annotations

import numpy as np
import torch

from meshshard.ops._backends import WITH_CLUSTER, require_cluster
from meshshard.ops.cell_index import CellIndex

__all__ = [
    "BACKENDS",
    "KnnIndex",
    "available_backends",
    "knn", "radius", "radius_padded", "resolve_backend", "sqdist"]

BACKENDS = ("auto", "kdtree", "grid", "brute", "cluster")

# brute force works on tiles of at most this many (query, point) pairs
_TILE_PAIRS = 1 << 20


def available_backends() -> list[str]:
    """Concrete backends usable in this environment."""
    return ["kdtree", "grid", "brute"] + (["cluster"] if WITH_CLUSTER else [])


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map ``"auto"`` to a concrete backend and check that the backend exists."""
    if backend not in BACKENDS:
        msg = f"backend={backend!r} is not one of {BACKENDS}"
        raise ValueError(msg)
    if backend == "auto":
        return "kdtree" if device.type == "cpu" else "grid"
    if backend == "cluster":
        require_cluster()
    return backend


def sqdist(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances in float64, ``((y - x) ** 2).sum(-1)`` with broadcasting."""
    return (y.double() - x.double()).pow(2).sum(-1)


def _empty_knn(m: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.full((m, k), float("inf"), dtype=torch.float64, device=device),
        torch.full((m, k), -1, dtype=torch.int64, device=device),
    )


def _sort_rows(d2: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row by (d2, idx); -1 / inf padding goes last."""
    big = torch.iinfo(torch.int64).max
    key_idx = torch.where(idx < 0, torch.full_like(idx, big), idx)
    o = torch.argsort(key_idx, dim=1, stable=True)
    d2, idx = d2.gather(1, o), idx.gather(1, o)
    o = torch.argsort(d2, dim=1, stable=True)
    return d2.gather(1, o), idx.gather(1, o)


def knn(
    x: torch.Tensor, y: torch.Tensor, k: int, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` nearest rows of ``x`` for every row of ``y`` (single process).

    Parameters
    ----------
    x : Tensor of shape (n, d)
        Points searched.
    y : Tensor of shape (m, d)
        Queries.
    k : int
        Neighbours per query (>= 1).
    backend : {"auto", "kdtree", "grid", "brute", "cluster"}

    Returns
    -------
    d2 : Tensor of shape (m, k), float64
        Squared distances, ascending; ``inf`` where ``x`` has fewer than ``k`` rows.
    idx : Tensor of shape (m, k), int64
        Row indices into ``x``, ties broken by the lower index; ``-1`` as padding.

    Example
    -------
    >>> d2, idx = knn(torch.rand(100, 3), torch.rand(5, 3), 4)
    """
    return KnnIndex(x, backend=backend).query(y, k)


class KnnIndex:
    """The points ``x`` prepared once for many :func:`knn`-style queries.

    With the ``"kdtree"`` backend the cKDTree (and its float64 copy of ``x``, shared when ``x``
    is already float64 on the CPU) is built once here, with ``"grid"`` the cell list (on
    ``x``'s device); ``"brute"`` and ``"cluster"`` keep ``x`` and search it per query.
    ``index.query(y, k)`` equals ``knn(x, y, k, backend=...)``.

    Memory: ``"kdtree"`` holds about 40 bytes per point (the float64 copy, the tree's int64
    permutation and its nodes).
    """

    def __init__(self, x: torch.Tensor, *, backend: str = "auto", bounds=None) -> None:
        self.x = x
        self.backend = resolve_backend(backend, x.device)
        self._xn = self._tree = self._grid = None
        if self.backend == "kdtree" and x.shape[0]:
            self._xn = x.detach().double().cpu().numpy()
            self._tree = _tree(self._xn)
        elif self.backend == "grid" and x.shape[0]:
            self._grid = _cell_index(x, bounds=bounds)

    def within(self, y: torch.Tensor, k: int, bound2: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`query`, keeping only neighbours with ``d2 <= bound2`` (m,) (``inf`` / ``-1``
        for the others): the answer to forwarded kNN queries. The grid searches only the
        cells within each bound (one pass)."""
        if self.backend == "grid" and self._grid is not None and y.shape[0]:
            d2, idx = self._grid.knn_within(y, min(k, self.x.shape[0]), bound2.sqrt())
            if idx.shape[1] < k:
                m = y.shape[0]
                d2 = torch.cat([d2, d2.new_full((m, k - idx.shape[1]), float("inf"))], 1)
                idx = torch.cat([idx, idx.new_full((m, k - idx.shape[1]), -1)], 1)
        else:
            d2, idx = self.query(y, k)
        ok = (idx >= 0) & (d2 <= bound2[:, None])  # <=: a tie with the bound may win by index
        return torch.where(ok, d2, float("inf")), torch.where(ok, idx, -1)

    def query(self, y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(d2, idx)`` of shape (m, k) as :func:`knn` returns them."""
        x = self.x
        device = x.device
        m, n = y.shape[0], x.shape[0]
        if m == 0 or n == 0:
            return _empty_knn(m, k, device)
        kk = min(k, n)
        if self.backend == "kdtree":
            d2, idx = _query_tree(self._tree, self._xn, y, kk, device)
        elif self.backend == "grid":
            d2, idx = self._grid.knn(y, kk)
        elif self.backend == "brute":
            d2, idx = _knn_brute(x, y, kk)
        else:
            d2, idx = _knn_cluster(x, y, kk)
        if kk < k:
            pad_d, pad_i = _empty_knn(m, k - kk, device)
            d2, idx = torch.cat([d2, pad_d], 1), torch.cat([idx, pad_i], 1)
        return d2, idx


def _cell_index(x: torch.Tensor, **kw):
    if x.shape[1] > 4:
        msg = (f"backend='grid' indexes points of 1 to 4 coordinates, got {x.shape[1]}; "
               "use backend='kdtree' or 'brute'")
        raise ValueError(msg)
    return CellIndex(x, **kw)


def _tree(points: np.ndarray):
    """cKDTree with sliding-midpoint splits and no node shrinking: about 2x faster to build and
    faster to query than the defaults on 300k uniform points here (same answers)."""
    from scipy.spatial import cKDTree

    return cKDTree(points, balanced_tree=False, compact_nodes=False)


def tree_workers() -> int:
    """Threads for a cKDTree query: torch's intra-op budget of this process (at least 1).
    scipy's ``workers=-1`` would start one per core in every rank."""
    return max(1, torch.get_num_threads())


def _query_tree(tree, xn: np.ndarray, y: torch.Tensor, k: int, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """k nearest of ``y`` in the cKDTree ``tree`` over ``xn`` (float64), in (d2, idx) order."""
    yn = y.detach().double().cpu().numpy()
    n = xn.shape[0]
    kq = min(k + 1, n)  # one extra to see ties that cross the k-th place
    _, ii = tree.query(yn, k=kq, workers=tree_workers())
    ii = np.asarray(ii, dtype=np.int64).reshape(yn.shape[0], kq)
    if ii.size and int(ii.max()) >= n:  # cKDTree's "none found" sentinel: distances overflowed
        msg = ("knn: the kd-tree found no neighbour for some queries (squared distances not "
               "finite in float64); rescale the coordinates (e.g. to metres)")
        raise ValueError(msg)
    xt, yt = torch.from_numpy(xn), torch.from_numpy(yn)
    idx = torch.from_numpy(ii)
    d2 = sqdist(yt[:, None, :], xt[idx])
    # cKDTree's order is by its own distances: re-sort only rows that are not already in
    # (d2, idx) order under ours (ties, or last-bit differences)
    step_d = d2[:, 1:] - d2[:, :-1]
    bad = ((step_d < 0) | ((step_d == 0) & (idx[:, 1:] < idx[:, :-1]))).any(1)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten()
        d2[rows], idx[rows] = _sort_rows(d2[rows], idx[rows])
    if kq > k:
        tied = torch.nonzero(d2[:, k - 1] == d2[:, k]).flatten()
        for row in tied.tolist():  # exact ties across the cut: rare, resolved by a ball query
            bound = float(d2[row, k - 1])
            cand = tree.query_ball_point(yn[row], r=np.sqrt(bound) * (1 + 1e-9) + 1e-300)
            cand = torch.as_tensor(np.sort(np.asarray(cand, dtype=np.int64)))
            cd2 = sqdist(yt[row][None, :], xt[cand])
            keep = cd2 <= bound
            cd2, cand = cd2[keep], cand[keep]
            o = torch.argsort(cd2, stable=True)[:k]
            d2[row, :k], idx[row, :k] = cd2[o], cand[o]
    return d2[:, :k].to(device), idx[:, :k].to(device)


def _knn_brute(x: torch.Tensor, y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = x.detach().double(), y.detach().double()
    m, n = y.shape[0], x.shape[0]
    col_chunk = max(k, min(n, 4096))
    row_chunk = max(1, _TILE_PAIRS // col_chunk)
    out_d, out_i = [], []
    for r0 in range(0, m, row_chunk):
        yc = y[r0 : r0 + row_chunk]
        best_d = torch.empty((yc.shape[0], 0), dtype=torch.float64, device=x.device)
        best_i = torch.empty((yc.shape[0], 0), dtype=torch.int64, device=x.device)
        for c0 in range(0, n, col_chunk):
            xc = x[c0 : c0 + col_chunk]
            d2 = sqdist(yc[:, None, :], xc[None, :, :])
            ii = torch.arange(c0, c0 + xc.shape[0], device=x.device).expand_as(d2)
            # earlier candidates have lower indices, so a stable sort keeps (d2, idx) order
            cd = torch.cat([best_d, d2], 1)
            ci = torch.cat([best_i, ii], 1)
            o = torch.argsort(cd, dim=1, stable=True)[:, :k]
            best_d, best_i = cd.gather(1, o), ci.gather(1, o)
            # re-sort by index so the next tile's stable merge keeps ties by index
            o = torch.argsort(best_i, dim=1)
            best_d, best_i = best_d.gather(1, o), best_i.gather(1, o)
        best_d, best_i = _sort_rows(best_d, best_i)
        out_d.append(best_d)
        out_i.append(best_i)
    return torch.cat(out_d), torch.cat(out_i)


def _knn_cluster(x: torch.Tensor, y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    tc = require_cluster()
    kq = min(k + 1, x.shape[0])
    # forwarded queries arrive as float64; torch_cluster wants one dtype (the cast is exact
    # for queries that started in x's dtype; distances are recomputed in float64 below)
    ei = tc.knn(x.detach(), y.detach().to(x.dtype), kq)
    m = y.shape[0]
    idx = torch.full((m, kq), -1, dtype=torch.int64, device=x.device)
    counts = torch.bincount(ei[0], minlength=m)
    start = torch.cumsum(counts, 0) - counts
    pos = torch.arange(ei.shape[1], device=x.device) - start[ei[0]]
    idx[ei[0], pos] = ei[1]
    d2 = torch.where(idx >= 0, sqdist(y[:, None, :], x[idx.clamp_min(0)]), float("inf"))
    d2, idx = _sort_rows(d2, idx)
    if kq > k:
        tied = torch.nonzero(d2[:, k - 1] == d2[:, k]).flatten()
        if tied.numel():  # resolve exact ties across the k-th place by brute force on those rows
            td, ti = _knn_brute(x, y[tied], k)
            d2[tied, :k], idx[tied, :k] = td, ti
    return d2[:, :k], idx[:, :k]


def radius(
    x: torch.Tensor, y: torch.Tensor, r: float, *, backend: str = "auto",
    key: torch.Tensor | None = None, bounds=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All rows of ``x`` within distance ``r`` (``<= r``) of every row of ``y``.

    Parameters
    ----------
    x : Tensor of shape (n, d)
    y : Tensor of shape (m, d)
    r : float
        Radius (> 0).
    backend : {"auto", "kdtree", "grid", "brute", "cluster"}

    Returns
    -------
    ptr : Tensor of shape (m + 1,), int64
        Query ``i``'s neighbours are ``idx[ptr[i]:ptr[i + 1]]``.
    idx : Tensor of shape (E,), int64
        Row indices into ``x``, per query sorted by (distance, index).
    d2 : Tensor of shape (E,), float64
        Squared distances.

    With ``backend="grid"``, ``key`` (n,) orders ties instead of the row index and
    ``bounds`` (a box holding the points, host floats) saves a read-back.
    """
    device = x.device
    be = resolve_backend(backend, device)
    m, n = y.shape[0], x.shape[0]
    if m == 0 or n == 0:
        return (
            torch.zeros(m + 1, dtype=torch.int64, device=device),
            torch.empty(0, dtype=torch.int64, device=device),
            torch.empty(0, dtype=torch.float64, device=device),
        )
    if be == "grid":
        return _cell_index(x, cell=r, key=key, bounds=bounds).radius(y, r)
    if be == "kdtree":
        row, col = _radius_kdtree(x, y, r)
    elif be == "brute":
        row, col = _radius_brute(x, y, r)
    else:
        tc = require_cluster()
        ei = tc.radius(x.detach(), y.detach().to(x.dtype), r * (1 + 1e-6), max_num_neighbors=n)
        row, col = ei[0], ei[1]
    row, col = row.to(device), col.to(device)
    d2 = sqdist(y[row], x[col]).to(device)
    keep = d2.sqrt() <= r
    row, col, d2 = row[keep], col[keep], d2[keep]
    # order by (row, d2, col) with stable sorts from the last key to the first
    o = torch.argsort(col, stable=True)
    row, col, d2 = row[o], col[o], d2[o]
    o = torch.argsort(d2, stable=True)
    row, col, d2 = row[o], col[o], d2[o]
    o = torch.argsort(row, stable=True)
    row, col, d2 = row[o], col[o], d2[o]
    ptr = torch.zeros(m + 1, dtype=torch.int64, device=device)
    ptr[1:] = torch.cumsum(torch.bincount(row, minlength=m), 0)
    return ptr, col, d2


def radius_padded(
    x: torch.Tensor, y: torch.Tensor, r: float, width: int, *, backend: str = "auto",
    key: torch.Tensor | None = None, bounds=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The closest ``width`` rows of ``x`` within ``r`` (``<= r``) of every row of ``y``.

    A static shape: with ``backend="grid"`` no size is read back besides the cell list's
    chunk widths (one host sync).

    Parameters
    ----------
    key : Tensor of shape (n,), int64, optional
        Tie-break order of ``x``'s rows (default: the row index), e.g. global indices.
    bounds : (lo, hi), optional
        A box holding ``x`` (host floats): the grid then needs no read-back of it.

    Returns
    -------
    d2 : Tensor of shape (m, width), float64
        Squared distances, ascending (ties by ``key``), ``inf`` padding.
    idx : Tensor of shape (m, width), int64
        Rows of ``x``, ``-1`` padding.
    """
    device = x.device
    be = resolve_backend(backend, device)
    m, n = y.shape[0], x.shape[0]
    if be == "grid" and n:
        return _cell_index(x, cell=r, key=key, bounds=bounds).radius_padded(y, r, width)
    d2 = torch.full((m, width), float("inf"), dtype=torch.float64, device=device)
    idx = torch.full((m, width), -1, dtype=torch.int64, device=device)
    if m == 0 or n == 0:
        return d2, idx
    ptr, col, cd2 = radius(x, y, r, backend=be)
    row = torch.repeat_interleave(torch.arange(m, device=device), torch.diff(ptr))
    kk = torch.arange(n, device=device) if key is None else key.to(device)
    o = torch.argsort(kk[col], stable=True)
    o = o[torch.argsort(cd2[o], stable=True)]
    o = o[torch.argsort(row[o], stable=True)]
    row, col, cd2 = row[o], col[o], cd2[o]
    pos = torch.arange(row.numel(), device=device) - ptr[row]
    keep = pos < width
    d2[row[keep], pos[keep]] = cd2[keep]
    idx[row[keep], pos[keep]] = col[keep]
    return d2, idx


def _radius_kdtree(x: torch.Tensor, y: torch.Tensor, r: float) -> tuple[torch.Tensor, torch.Tensor]:

    xn = x.detach().double().cpu().numpy()
    yn = y.detach().double().cpu().numpy()
    lists = _tree(xn).query_ball_point(yn, r=r * (1 + 1e-9), workers=tree_workers())
    counts = np.fromiter((len(a) for a in lists), dtype=np.int64, count=len(lists))
    row = np.repeat(np.arange(len(lists), dtype=np.int64), counts)
    col = (
        np.concatenate([np.asarray(a, dtype=np.int64) for a in lists])
        if counts.sum()
        else (np.empty(0, dtype=np.int64))
    )
    return torch.from_numpy(row), torch.from_numpy(col)


def _radius_brute(x: torch.Tensor, y: torch.Tensor, r: float) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = x.detach().double(), y.detach().double()
    m, n = y.shape[0], x.shape[0]
    col_chunk = min(n, 4096)
    row_chunk = max(1, _TILE_PAIRS // col_chunk)
    rows, cols = [], []
    lim = (r * (1 + 1e-9)) ** 2
    for r0 in range(0, m, row_chunk):
        yc = y[r0 : r0 + row_chunk]
        for c0 in range(0, n, col_chunk):
            d2 = sqdist(yc[:, None, :], x[None, c0 : c0 + col_chunk, :])
            rr, cc = torch.nonzero(d2 <= lim, as_tuple=True)
            rows.append(rr + r0)
            cols.append(cc + c0)
    return torch.cat(rows), torch.cat(cols)
