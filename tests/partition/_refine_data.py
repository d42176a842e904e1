"""Shared by the ghost-row refinement tests: a brute-force count, a grid graph, a slab cut
(the graphs they run on are fixtures in conftest.py)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def _brute_volume(g, a) -> int:
    """Distinct (vertex, remote part) pairs, one vertex at a time (the definition)."""
    total = 0
    for v in range(g.shape[0]):
        seen = {int(a[u]) for u in g.indices[g.indptr[v] : g.indptr[v + 1]]}
        seen.discard(int(a[v]))
        total += len(seen)
    return total


def _grid(nx: int, ny: int):
    path = lambda m: sp.diags([1, 1], [-1, 1], shape=(m, m), dtype=int)  # noqa: E731
    return (sp.kron(sp.eye(ny), path(nx)) + sp.kron(path(ny), sp.eye(nx))).tocsr().astype(int)


def _slabs(x: np.ndarray, w: np.ndarray, targets) -> np.ndarray:
    """Cut along x so that part p holds about targets[p] of the weight (a poor, jagged cut
    on an unstructured graph, within balance)."""
    order = np.argsort(x, kind="stable")
    frac = np.cumsum(w[order]) / w.sum()
    edges = np.cumsum(targets)[:-1]
    a = np.empty(x.size, dtype=np.int64)
    a[order] = np.searchsorted(edges, frac - 0.5 * w[order] / w.sum())
    return a
