"""Input checks for the partitioners, in one place.

Every check raises with a message that says what was found and how to fix it. Nothing here
communicates; it is plain numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "as_points",
    "check_distance_range",
    "check_epsilon",
    "check_tree_indices",
    "check_graph",
    "check_int",
    "check_parts",
    "check_targets",
    "check_weights",
]


def _to_numpy(a: Any) -> np.ndarray:
    """numpy view of ``a``; torch tensors are detached and moved to the CPU first."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):  # torch.Tensor without importing torch
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def as_points(points: Any, name: str = "points", *, keep_float: bool = False) -> np.ndarray:
    """Validate coordinates and return them as a float64 array of shape (N, D), D in {2, 3}.

    With ``keep_float`` a float32 array stays float32 (no copy): for callers that compute in
    float64 chunk by chunk anyway.

    Raises
    ------
    ValueError
        Wrong shape, or NaN/inf coordinates (with their count and the first bad row).
    TypeError
        Non-numeric dtype (e.g. strings or objects).
    """
    arr = _to_numpy(points)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        msg = (
            f"{name} must hold real numbers, got dtype {arr.dtype}; "
            "pass a float array of shape (N, 3) or (N, 2)"
        )
        raise TypeError(msg)
    if arr.ndim != 2 or arr.shape[1] not in (2, 3):
        msg = (
            f"{name} must have shape (N, 3) or (N, 2), got {arr.shape}; "
            "reshape to one row per point (e.g. points.reshape(-1, 3))"
        )
        raise ValueError(msg)
    keep = keep_float and arr.dtype in (np.float32, np.float64)
    arr = np.ascontiguousarray(arr, dtype=arr.dtype if keep else np.float64)
    # NaN propagates through min/max and inf shows in them: two reductions, no (N, D) temporary
    if arr.size and not (np.isfinite(arr.min()) and np.isfinite(arr.max())):
        finite = np.isfinite(arr).all(axis=1)
        bad = np.flatnonzero(~finite)
        msg = (
            f"{name} has {bad.size} row(s) with NaN or inf coordinates (first at row {bad[0]}); "
            "drop or repair those rows before partitioning"
        )
        raise ValueError(msg)
    return arr


def check_distance_range(points: np.ndarray, name: str = "points") -> None:
    """Refuse coordinates whose squared distances leave float64's range.

    A kd-tree compares squared distances in float64: past an extent of about 1e154 they
    overflow to inf (scipy's cKDTree then reports "no neighbour", its sentinel index N), and
    below about 1e-154 they underflow to 0 (every point ties with every other). Both give a
    wrong graph, the first a crash in scipy.sparse. Cheap: two reductions.

    Raises
    ------
    ValueError
        Naming ``name``, the extent found and the fix (rescale the coordinates).
    """
    if points.size == 0:
        return
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        ext = np.asarray(points.max(axis=0), dtype=np.float64) - np.asarray(
            points.min(axis=0), dtype=np.float64)
        sq = float(np.sum(ext * ext))
        top = float(ext.max())
    if not np.isfinite(sq):
        msg = (
            f"{name}: coordinates span {top:.3g}, so squared distances overflow float64 "
            "(neighbour search would be meaningless); rescale the coordinates (e.g. to metres)"
        )
        raise ValueError(msg)
    if top > 0 and sq < np.finfo(np.float64).tiny / np.finfo(np.float64).eps:
        msg = (
            f"{name}: coordinates span only {top:.3g}, so squared distances underflow float64 "
            "(all points would tie); rescale the coordinates (e.g. to metres)"
        )
        raise ValueError(msg)


def check_tree_indices(idx: np.ndarray, n: int, name: str = "points") -> np.ndarray:
    """Neighbour indices from a kd-tree query, refused when any is outside ``[0, n)``.

    scipy's cKDTree answers "no neighbour found" with the index ``n`` (and distance inf);
    such an index must never reach a sparse matrix (scipy.sparse does not bound-check CSR
    columns and corrupts memory in ``a + a.T``).
    """
    if idx.size and (int(idx.max()) >= n or int(idx.min()) < 0):
        bad = int(np.count_nonzero((idx >= n) | (idx < 0)))
        msg = (
            f"{name}: the kd-tree found no neighbour for {bad} query slot(s) (distances not "
            "finite in float64); check the coordinates for extreme values and rescale them"
        )
        raise ValueError(msg)
    return idx


def check_int(name: str, val: Any, low: int) -> int:
    """Validate an integer option ``name`` (not a bool) that must be ``>= low``."""
    if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < low:
        msg = f"{name}={val!r} must be an integer >= {low}"
        raise ValueError(msg)
    return int(val)


def check_epsilon(epsilon: Any) -> None:
    """Validate a partitioner's allowed imbalance ``epsilon``: a float in (0, 1)."""
    if (
        isinstance(epsilon, bool)
        or not isinstance(epsilon, (int, float, np.floating))
        or not (0 < float(epsilon) < 1)
    ):
        msg = f"epsilon={epsilon!r} must be a float in (0, 1), the allowed imbalance (0.03 = 3 %)"
        raise ValueError(msg)


def check_parts(parts: Any, n: int, *, allow_empty: bool) -> int:
    """Validate the number of parts against the number of points ``n``."""
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)):
        msg = f"parts must be an int, got {type(parts).__name__} ({parts!r})"
        raise TypeError(msg)
    parts = int(parts)
    if parts < 1:
        msg = f"parts={parts} must be >= 1"
        raise ValueError(msg)
    if n < parts and not allow_empty:
        msg = (
            f"only {n} point(s) for parts={parts}: some shards would be empty; "
            "pass allow_empty=True (empty shards are legal) or use fewer parts"
        )
        raise ValueError(msg)
    return parts


def check_weights(weights: Any, n: int) -> np.ndarray | None:
    """Validate per-point weights: shape (N,), finite, >= 0, not all zero."""
    if weights is None:
        return None
    w = _to_numpy(weights)
    if w.dtype == bool or not (
        np.issubdtype(w.dtype, np.floating) or np.issubdtype(w.dtype, np.integer)
    ):
        msg = f"weights must be numeric, got dtype {w.dtype}"
        raise TypeError(msg)
    if w.shape != (n,):
        msg = f"weights must have shape ({n},) (one per point), got {w.shape}"
        raise ValueError(msg)
    w = w.astype(np.float64)
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        idx = np.flatnonzero(bad)
        msg = (
            f"weights has {idx.size} negative, NaN or inf value(s) (first at row {idx[0]}: "
            f"{w[idx[0]]}); weights must be finite and >= 0"
        )
        raise ValueError(msg)
    if n and w.sum() <= 0:
        msg = "weights are all zero; give at least one point a positive weight"
        raise ValueError(msg)
    return w


def check_targets(targets: Any, parts: int) -> np.ndarray:
    """Validate target fractions: shape (parts,), >= 0, sum to 1 (tolerance 1e-6).

    ``None`` means equal fractions.
    """
    if targets is None:
        return np.full(parts, 1.0 / parts)
    t = np.asarray(_to_numpy(targets), dtype=np.float64)
    if t.shape != (parts,):
        msg = f"targets must have one fraction per part ({parts}), got shape {t.shape}"
        raise ValueError(msg)
    if not np.isfinite(t).all() or (t < 0).any():
        msg = f"targets must be finite and >= 0, got {t.tolist()}"
        raise ValueError(msg)
    s = float(t.sum())
    if abs(s - 1.0) > 1e-6:
        msg = (
            f"targets must sum to 1, got {s:.6g} ({t.tolist()}); "
            "normalise them, e.g. targets / targets.sum()"
        )
        raise ValueError(msg)
    return t / s


def check_graph(graph: Any, n: int | None = None) -> Any:
    """Validate an undirected graph given as a scipy.sparse matrix (or CSR-like object).

    Returns it as a canonical ``scipy.sparse.csr_matrix`` (sorted indices, no duplicates).

    Raises
    ------
    ValueError
        Not square, wrong number of vertices, indices out of bounds, self loops, asymmetric,
        non-positive edge weights. pymetis can crash the whole process on such graphs, so
        this runs before any METIS call.
    """
    import scipy.sparse as sp

    if not sp.issparse(graph):
        msg = (
            f"graph must be a scipy.sparse matrix (adjacency, N x N), got {type(graph).__name__}; "
            "build one with meshshard.partition.knn_graph or dual_graph"
        )
        raise TypeError(msg)
    g = graph.tocsr()
    if g.shape[0] != g.shape[1]:
        msg = f"graph adjacency must be square, got shape {g.shape}"
        raise ValueError(msg)
    if n is not None and g.shape[0] != n:
        msg = f"graph has {g.shape[0]} vertices but there are {n} points"
        raise ValueError(msg)
    nv = g.shape[0]
    if g.indices.size and (g.indices.min() < 0 or g.indices.max() >= nv):
        msg = f"graph has neighbour indices outside [0, {nv})"
        raise ValueError(msg)
    g = g.copy()
    g.sum_duplicates()
    g.sort_indices()
    g.eliminate_zeros()
    if g.nnz and g.data.min() < 0:
        msg = "graph has negative edge weights; METIS needs positive integer weights"
        raise ValueError(msg)
    loops = int(np.count_nonzero(g.diagonal()))
    if loops:
        first = int(np.flatnonzero(g.diagonal())[0])
        msg = (
            f"graph has {loops} self loop(s) (first at vertex {first}); "
            "remove them, e.g. g.setdiag(0); g.eliminate_zeros()"
        )
        raise ValueError(msg)
    diff = g - g.T
    diff.eliminate_zeros()
    if diff.nnz:
        r, c = diff.nonzero()
        msg = (
            f"graph is not symmetric ({diff.nnz} entries differ from the transpose, e.g. "
            f"({r[0]}, {c[0]})); symmetrise it, e.g. g = g.maximum(g.T)"
        )
        raise ValueError(msg)
    return g


def unique_int(a: np.ndarray) -> np.ndarray:
    """Sorted unique values of an integer array.

    ``np.unique`` in numpy 2.4 takes a hash-based path that measured ~60x slower than this
    sort-and-compare on 9M int64 keys (11 s vs 0.18 s) on this machine.
    """
    s = np.sort(np.asarray(a).reshape(-1))
    if s.size == 0:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]
