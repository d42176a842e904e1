"""Cell centres, normals and areas straight from VTK connectivity, vectorised in numpy.

VTK filters (``cell_centers``, ``compute_cell_sizes``, ``compute_normals``) copy the whole mesh
and its arrays; on an 8.8M-cell surface they cost more than reading the file. Here cells are
grouped by vertex count; a group whose cells are contiguous (the usual case: all quads, then all
triangles) is a reshape *view* of the connectivity, otherwise one gather. Coordinates are
processed one component at a time in the points' own precision (float32 for DrivaerML), so the
temporaries stay at a few bytes per cell.

Conventions match VTK for the usual cells: the centre is the mean of the cell's vertices (VTK's
parametric centre for triangles, quads, tets, hexes and wedges; for general polygons VTK returns
a parametric point that is not the vertex mean, and this module keeps the vertex mean); the
normal of a polygon is its normalised vector area (Newell's normal, as VTK computes it); the
area is the vector area's norm (exact for planar polygons).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = [
    "cell_centres",
    "polygon_geometry",
    "polygon_normals_areas",
    "streamed_centres",
    "vtk_cells",
]


def vtk_cells(cell_array) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, connectivity)`` of a ``vtkCellArray`` as numpy views (no copy when VTK
    stores them as 64-bit ids). ``offsets`` has length ``n_cells + 1``."""
    from vtkmodules.util.numpy_support import vtk_to_numpy

    offsets = vtk_to_numpy(cell_array.GetOffsetsArray())
    conn = vtk_to_numpy(cell_array.GetConnectivityArray())
    return offsets, conn


def _sizes_present(count: np.ndarray) -> np.ndarray:
    """Distinct vertex counts, without sorting millions of entries (np.unique would)."""
    if count.size == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = int(count.min()), int(count.max())
    if lo == hi:
        return np.array([lo])
    if hi <= 1 << 16:
        return np.flatnonzero(np.bincount(count, minlength=hi + 1))
    return np.unique(count)


def _groups(offsets: np.ndarray, conn: np.ndarray, cells: np.ndarray | None, block: int):
    """Yield ``(k, out_rows, idx)`` with ``idx`` of shape (m, k): vertex ids of ``m`` cells of
    ``k`` vertices each, ``out_rows`` a slice or index array into the output."""
    n_all = offsets.size - 1
    if cells is None:
        count = np.diff(offsets)
        ks = _sizes_present(count)
        for k in ks:
            k = int(k)
            sel = None
            lo, hi = 0, n_all
            if ks.size > 1:
                is_k = count == k
                m = int(np.count_nonzero(is_k))
                lo = int(np.argmax(is_k))
                hi = lo + m
                if not is_k[lo:hi].all():  # interleaved sizes: index the cells of size k
                    sel = np.flatnonzero(is_k)
            contiguous = sel is None
            for b in range(0, (hi - lo) if contiguous else sel.size, block):
                if contiguous:
                    c0, c1 = lo + b, min(hi, lo + b + block)
                    start = int(offsets[c0])
                    yield k, slice(c0, c1), conn[start : start + k * (c1 - c0)].reshape(-1, k)
                else:
                    rows = sel[b : b + block]
                    yield k, rows, conn[offsets[rows][:, None] + np.arange(k)]
        return
    start = offsets[cells]
    count = offsets[cells + 1] - start
    for k in _sizes_present(count):
        k = int(k)
        sel = np.flatnonzero(count == k)
        for b in range(0, sel.size, block):
            rows = sel[b : b + block]
            yield k, rows, conn[start[rows][:, None] + np.arange(k)]


def _components(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pts = np.asarray(points)
    return tuple(np.ascontiguousarray(pts[:, d]) for d in range(3))  # type: ignore[return-value]


def cell_centres(
    points: np.ndarray,
    offsets: np.ndarray,
    conn: np.ndarray,
    cells: np.ndarray | None = None,
    *,
    block: int = 1 << 21,
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
        Cells per vectorised block (bounds the temporaries).

    Returns
    -------
    ndarray of shape (m, 3), in the points' floating dtype
    """
    n = offsets.size - 1 if cells is None else cells.size
    comps = _components(points)
    out = np.empty((n, 3), dtype=comps[0].dtype)
    _centres_into(out, comps, offsets, conn, cells, block)
    return out


def _centres_into(out, comps, offsets, conn, cells, block) -> None:
    for k, rows, idx in _groups(offsets, conn, cells, block):
        if k == 0:
            msg = "a cell with no vertices has no centre"
            raise ValueError(msg)
        for d, c in enumerate(comps):
            acc = c[idx[:, 0]]
            for j in range(1, k):
                acc += c[idx[:, j]]
            acc *= 1.0 / k
            out[rows, d] = acc


def streamed_centres(
    points: np.ndarray,
    offsets: np.ndarray,
    pieces: Iterable[tuple[int, np.ndarray]],
    cells: np.ndarray | None = None,
    *,
    block: int = 1 << 21,
) -> np.ndarray:
    """:func:`cell_centres` with the connectivity given as consecutive pieces
    ``(first id position, ids)`` (any cut, even inside a cell): only one piece and the
    vertices of the cell it cuts are held at a time.

    ``cells`` (optional) must be sorted. Raises ValueError when the pieces do not cover
    ``offsets[-1]`` ids exactly.
    """
    n = offsets.size - 1
    comps = _components(points)
    out = np.empty((n if cells is None else cells.size, 3), dtype=comps[0].dtype)
    carry = conn_base = None
    done = 0  # cells [0, done) are finished
    for v0, piece in pieces:
        if carry is not None and carry.size:
            buf, base = np.concatenate((carry, piece)), v0 - carry.size
        else:
            buf, base = piece, v0
        v1 = v0 + piece.size
        hi = int(np.searchsorted(offsets, v1, side="right")) - 1  # offsets[hi] <= v1
        if hi > done:
            local = offsets[done : hi + 1] - base
            if cells is None:
                _centres_into(out[done:hi], comps, local, buf, None, block)
            else:
                lo_i, hi_i = np.searchsorted(cells, [done, hi])
                if hi_i > lo_i:
                    _centres_into(out[lo_i:hi_i], comps, local, buf, cells[lo_i:hi_i] - done, block)
            done = hi
        carry = buf[int(offsets[done]) - base :]
        conn_base = v1
    if done != n or (conn_base or 0) != int(offsets[-1]):
        msg = f"the connectivity pieces cover {conn_base or 0} ids, the offsets {int(offsets[-1])}"
        raise ValueError(msg)
    return out


def polygon_geometry(
    points: np.ndarray,
    offsets: np.ndarray,
    conn: np.ndarray,
    *,
    block: int = 1 << 20,
    threads: int = 2,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centre, unit normal and area of every polygon in one pass over the connectivity.

    Blocks of ``block`` cells are processed by ``threads`` threads (numpy releases the GIL in
    the gathers and arithmetic); every block writes its own rows, so the result does not depend
    on ``threads``.

    Returns
    -------
    centres : ndarray of shape (n_cells, 3)
    normals : ndarray of shape (n_cells, 3)
        Zero for degenerate (zero-area) cells and for lines/vertices.
    areas : ndarray of shape (n_cells,)
        All in the points' floating dtype.
    """
    n = offsets.size - 1
    comps = _components(points)
    dt = comps[0].dtype
    centres = np.empty((n, 3), dtype=dt)
    vec = np.zeros((n, 3), dtype=dt)

    def work(item) -> None:
        k, rows, idx = item
        cols = [[c[idx[:, j]] for j in range(k)] for c in comps]  # cols[d][j]: (m,)
        for d in range(3):
            acc = cols[d][0].copy()
            for j in range(1, k):
                acc += cols[d][j]
            acc *= 1.0 / k
            centres[rows, d] = acc
        if k < 3:
            return
        (x, y, z) = cols
        if k == 3:  # (v1 - v0) x (v2 - v0)
            ax, ay, az = x[1] - x[0], y[1] - y[0], z[1] - z[0]
            bx, by, bz = x[2] - x[0], y[2] - y[0], z[2] - z[0]
        elif k == 4:  # the diagonals: (v2 - v0) x (v3 - v1)
            ax, ay, az = x[2] - x[0], y[2] - y[0], z[2] - z[0]
            bx, by, bz = x[3] - x[1], y[3] - y[1], z[3] - z[1]
        else:  # general polygon: sum over the fan, accumulated below
            ax = ay = az = bx = by = bz = None
        if ax is not None:
            vec[rows, 0] = 0.5 * (ay * bz - az * by)
            vec[rows, 1] = 0.5 * (az * bx - ax * bz)
            vec[rows, 2] = 0.5 * (ax * by - ay * bx)
            return
        sx = np.zeros_like(x[0])
        sy, sz = np.zeros_like(sx), np.zeros_like(sx)
        for j in range(1, k - 1):
            ax, ay, az = x[j] - x[0], y[j] - y[0], z[j] - z[0]
            bx, by, bz = x[j + 1] - x[0], y[j + 1] - y[0], z[j + 1] - z[0]
            sx += ay * bz - az * by
            sy += az * bx - ax * bz
            sz += ax * by - ay * bx
        vec[rows, 0], vec[rows, 1], vec[rows, 2] = 0.5 * sx, 0.5 * sy, 0.5 * sz

    items = _groups(offsets, conn, None, block)
    if threads > 1 and n > block:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            for _ in pool.map(work, items):
                pass
    else:
        for item in items:
            work(item)
    areas = np.sqrt(np.einsum("ij,ij->i", vec, vec))
    normals = np.divide(vec, areas[:, None], out=vec, where=areas[:, None] > 0)
    return centres, normals, areas


def polygon_normals_areas(
    points: np.ndarray, offsets: np.ndarray, conn: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Unit normal (n_cells, 3) and area (n_cells,) of every polygon."""
    _, normals, areas = polygon_geometry(points, offsets, conn)
    return normals, areas
