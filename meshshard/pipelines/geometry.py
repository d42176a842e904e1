"""Cell centres, normals and areas straight from VTK connectivity, vectorised in numpy.

VTK filters (``cell_centers``, ``compute_cell_sizes``, ``compute_normals``) copy the whole mesh
and its arrays; on an 8.8M-cell surface they cost more than reading the file. Here cells are
grouped by vertex count and each group is one reshape of the connectivity array.

Conventions match VTK for the usual cells: the centre is the mean of the cell's vertices (VTK's
parametric centre for triangles, quads, tets, hexes and wedges); the normal of a polygon is its
normalised vector area (Newell's normal, as VTK computes it); the area is the vector area's norm
(exact for planar polygons).
"""

from __future__ import annotations

import numpy as np

__all__ = ["cell_centres", "polygon_normals_areas", "vtk_cells"]


def vtk_cells(cell_array) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, connectivity)`` of a ``vtkCellArray`` as int64 numpy arrays (no copy of the
    points). ``offsets`` has length ``n_cells + 1``."""
    from vtkmodules.util.numpy_support import vtk_to_numpy

    offsets = vtk_to_numpy(cell_array.GetOffsetsArray()).astype(np.int64, copy=False)
    conn = vtk_to_numpy(cell_array.GetConnectivityArray()).astype(np.int64, copy=False)
    return offsets, conn


def _groups(offsets: np.ndarray, cells: np.ndarray | None):
    """Yield ``(k, cell_ids, start)`` for every vertex count ``k`` among ``cells``."""
    if cells is None:
        cells = np.arange(offsets.size - 1, dtype=np.int64)
    start = offsets[cells]
    count = offsets[cells + 1] - start
    ks = np.unique(count)
    if ks.size == 1:
        yield int(ks[0]), np.arange(cells.size), start
        return
    for k in ks:
        sel = np.flatnonzero(count == k)
        yield int(k), sel, start[sel]


def cell_centres(
    points: np.ndarray,
    offsets: np.ndarray,
    conn: np.ndarray,
    cells: np.ndarray | None = None,
    *,
    block: int = 1 << 20,
) -> np.ndarray:
    """Vertex-mean centre of every cell (or of ``cells`` only).

    Parameters
    ----------
    points : ndarray of shape (n_points, 3)
    offsets : ndarray of shape (n_cells + 1,)
    conn : ndarray of shape (offsets[-1],)
    cells : ndarray of shape (m,), optional
        Subset of cell ids; default all cells.
    block : int
        Cells per vectorised block (bounds the temporary memory to ``block * k * 24`` bytes).

    Returns
    -------
    ndarray of shape (m, 3), float64
    """
    n = offsets.size - 1 if cells is None else cells.size
    out = np.empty((n, 3), dtype=np.float64)
    for k, sel, start in _groups(offsets, cells):
        if k == 0:
            msg = "a cell with no vertices has no centre"
            raise ValueError(msg)
        for b in range(0, sel.size, block):
            s = start[b : b + block]
            idx = conn[s[:, None] + np.arange(k)]
            acc = points[idx[:, 0]].astype(np.float64)
            for j in range(1, k):
                acc += points[idx[:, j]]
            out[sel[b : b + block]] = acc / k
    return out


def polygon_normals_areas(
    points: np.ndarray, offsets: np.ndarray, conn: np.ndarray, *, block: int = 1 << 20
) -> tuple[np.ndarray, np.ndarray]:
    """Unit normal and area of every polygon (vector area by a fan from the first vertex).

    Returns
    -------
    normals : ndarray of shape (n_cells, 3), float64
        Zero for degenerate (zero-area) cells.
    areas : ndarray of shape (n_cells,), float64
    """
    n = offsets.size - 1
    vec = np.zeros((n, 3), dtype=np.float64)
    for k, sel, start in _groups(offsets, None):
        if k < 3:
            continue  # lines and vertices have no area
        for b in range(0, sel.size, block):
            s = start[b : b + block]
            idx = conn[s[:, None] + np.arange(k)]
            v0 = points[idx[:, 0]].astype(np.float64)
            acc = np.zeros_like(v0)
            prev = points[idx[:, 1]] - v0
            for j in range(2, k):
                cur = points[idx[:, j]] - v0
                acc += np.cross(prev, cur)
                prev = cur
            vec[sel[b : b + block]] = 0.5 * acc
    areas = np.linalg.norm(vec, axis=1)
    normals = np.divide(vec, areas[:, None], out=np.zeros_like(vec), where=areas[:, None] > 0)
    return normals, areas
