"""Graphs to partition: symmetric kNN graphs of point clouds and dual graphs of cell meshes.

Both are built without Python loops over points or cells: kNN through ``scipy.spatial.cKDTree``
(``workers=-1``) and ``scipy.sparse``; dual graphs by hashing every cell face (the sorted vertex
ids of the face) and pairing the cells that share one, with ``np.lexsort`` over all faces.
Graphs are ``scipy.sparse.csr_matrix`` adjacencies (N x N, symmetric, no self loops, entries 1).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from meshshard.io.cells import (
    CELL_FACES,
    CELL_NVERTS,
    VTK_POLYGON,
    VTK_POLYHEDRON,
    PolyhedronFaces,
)
from meshshard.partition._validation import as_points, unique_int
from meshshard.partition.sfc import curve_order, hilbert_codes
from meshshard.partition.weld import weld_points

__all__ = [
    "CELL_FACES",
    "cell_faces",
    "dual_graph",
    "knn_graph",
    "knn_graph_sorted",
    "mesh_connectivity",
    "mesh_polyhedra",
    "shared_face_pairs",
]

log = logging.getLogger(__name__)

#: the face tables live with the rest of the cell topology (:mod:`meshshard.io.cells`)
_VTK_POLYGON = VTK_POLYGON
_CELL_NVERTS = CELL_NVERTS


def _vtk_type_name(code: int) -> str:
    try:
        import pyvista as pv

        return pv.CellType(int(code)).name
    except Exception:  # unknown code or pyvista missing
        return f"type {int(code)}"


def knn_graph(points: Any, k: int = 8) -> Any:
    """Symmetric kNN graph: ``i ~ j`` when ``j`` is among the ``k`` nearest of ``i`` or vice versa.

    Parameters
    ----------
    points : array of shape (N, 3) or (N, 2)
    k : int
        Neighbours per point (excluding the point itself); capped at N - 1.

    Returns
    -------
    scipy.sparse.csr_matrix of shape (N, N)
        Binary (int32 ones), symmetric, no self loops.

    Examples
    --------
    >>> import numpy as np
    >>> g = knn_graph(np.random.default_rng(0).random((100, 3)), k=4)
    >>> bool((g != g.T).nnz == 0)
    True
    """
    graph, order = knn_graph_sorted(points, k)
    inv = np.empty_like(order)
    inv[order] = np.arange(order.size, dtype=order.dtype)
    return graph[inv][:, inv].tocsr()


def knn_graph_sorted(points: Any, k: int = 8) -> tuple[Any, np.ndarray]:
    """:func:`knn_graph` in Hilbert order: ``(graph_s, order)`` with vertex ``a`` of
    ``graph_s`` being point ``order[a]``.

    Querying the tree in curve order is ~3x faster than in input order (cache locality), and
    METIS does not care about vertex numbering, so :func:`meshshard.partition.metis` uses this
    form directly.
    """
    import scipy.sparse as sp
    from scipy.spatial import cKDTree

    pts = as_points(points)
    n = pts.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        msg = f"k={k!r} must be an int >= 1"
        raise ValueError(msg)
    k = int(min(k, max(n - 1, 0)))
    order = curve_order(hilbert_codes(pts)) if n else np.zeros(0, dtype=np.int64)
    if n == 0 or k == 0:
        return sp.csr_matrix((n, n), dtype=np.int32), order
    xs = pts[order]
    tree = cKDTree(xs, balanced_tree=False, compact_nodes=False)
    _, nbr = tree.query(xs, k=k + 1, workers=-1)
    nbr = nbr.astype(np.int64, copy=False)
    is_self = nbr == np.arange(n)[:, None]
    # duplicates can push the point itself out of its k + 1 hits: then drop the farthest hit
    is_self[~is_self.any(axis=1), k] = True
    cols = nbr[~is_self].reshape(n, k)
    indptr = np.arange(0, n * k + 1, k, dtype=np.int64)
    a = sp.csr_matrix((np.ones(n * k, dtype=np.int32), cols.reshape(-1), indptr), shape=(n, n))
    a = (a + a.T).tocsr()
    a.data[:] = 1
    a.sort_indices()
    return a, order


def _symmetric_binary(rows: np.ndarray, cols: np.ndarray, n: int) -> Any:
    """CSR adjacency with an edge wherever (rows, cols) or (cols, rows) is listed."""
    import scipy.sparse as sp

    data = np.ones(rows.size, dtype=np.int32)
    a = sp.csr_matrix((data, (rows, cols)), shape=(n, n))
    a = a + a.T
    a.data[:] = 1
    a.setdiag(0)
    a.eliminate_zeros()
    a.sort_indices()
    return a.tocsr()


def mesh_connectivity(mesh: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat ``(connectivity, offsets, celltypes)`` of a pyvista/VTK dataset.

    ``offsets`` has length ncells + 1. PolyData polygons become triangles, quads or polygons;
    PolyData verts, lines and strips are rejected by name.
    """
    import pyvista as pv

    if not isinstance(mesh, pv.DataSet):
        mesh = pv.wrap(mesh)
    if isinstance(mesh, pv.PolyData):
        for attr, what in (("n_verts", "vertices"), ("n_lines", "lines"), ("n_strips", "strips")):
            count = int(getattr(mesh, attr))
            if count:
                msg = (
                    f"the PolyData has {count} {what} besides its polygons; the dual graph "
                    "supports polygon surfaces only (e.g. mesh.triangulate() strips, drop lines)"
                )
                raise ValueError(msg)
        polys = mesh.GetPolys()
        conn = pv.convert_array(polys.GetConnectivityArray()).astype(np.int64)
        off = pv.convert_array(polys.GetOffsetsArray()).astype(np.int64)
        nv = np.diff(off)
        types = np.full(nv.size, _VTK_POLYGON, dtype=np.int64)
        types[nv == 3] = 5
        types[nv == 4] = 9
        return conn, off, types
    if not isinstance(mesh, pv.UnstructuredGrid):
        mesh = mesh.cast_to_unstructured_grid()
    conn = np.asarray(mesh.cell_connectivity, dtype=np.int64)
    off = np.asarray(pv.convert_array(mesh.GetCells().GetOffsetsArray()), dtype=np.int64)
    types = np.asarray(mesh.celltypes, dtype=np.int64)
    return conn, off, types


def mesh_polyhedra(mesh: Any) -> PolyhedronFaces | None:
    """The faces of ``mesh``'s polyhedral cells (VTK type 42), checked, or None without any.

    Raises
    ------
    ValueError
        The polyhedron faces are inconsistent (ids out of range, too few faces).
    """
    import pyvista as pv

    if not isinstance(mesh, pv.DataSet):
        mesh = pv.wrap(mesh)
    if not isinstance(mesh, pv.UnstructuredGrid):
        return None
    poly = PolyhedronFaces.from_vtk(mesh)
    if poly is not None:
        poly.check(int(mesh.n_points), np.asarray(mesh.celltypes))
    return poly


def dual_graph(
    mesh: Any = None,
    *,
    cells: Any = None,
    offsets: Any = None,
    celltypes: Any = None,
    polyhedra: PolyhedronFaces | None = None,
    merge_tol: float | None = None,
) -> Any:
    """Dual graph of a cell mesh: cells are vertices, cells sharing a face are adjacent.

    3-D cells (tetra, hexahedron, voxel, wedge, pyramid, polyhedron) are adjacent when they
    share a face (the same set of points); 2-D cells (triangle, quad, pixel, polygon) when they
    share an edge. Mixed meshes work: a polyhedron's quad face meets a hexahedron's.

    Parameters
    ----------
    mesh : pyvista.DataSet or vtkDataSet, optional
        Any pyvista mesh (UnstructuredGrid, PolyData with polygons, structured grids).
    cells : array, optional
        Instead of ``mesh``: either an (ncells, nverts) array of vertex ids with a single
        ``celltypes`` int, or flat connectivity with ``offsets`` (length ncells + 1) and
        ``celltypes`` (length ncells), VTK codes.
    offsets, celltypes : array, optional
        See ``cells``.
    polyhedra : PolyhedronFaces, optional
        With ``cells``: the faces of the cells of type 42 (required when there are any).
    merge_tol : float, optional
        Merge points closer than ``merge_tol`` x the shortest edge first
        (:func:`~meshshard.partition.weld.weld_points`, logged), so that cells sharing a face
        by coordinates are adjacent even where the file stores its points twice (foamToVTK
        gives every boundary patch its own copies). Default: cells match by point ids only.

    Returns
    -------
    scipy.sparse.csr_matrix of shape (ncells, ncells)
        Binary, symmetric, no self loops.

    Raises
    ------
    ValueError
        Unsupported VTK cell types (named), inconsistent connectivity, polyhedra without
        their faces.

    Examples
    --------
    >>> import numpy as np
    >>> quads = np.array([[0, 1, 4, 3], [1, 2, 5, 4]])
    >>> dual_graph(cells=quads, celltypes=9).toarray().tolist()
    [[0, 1], [1, 0]]
    """
    conn, off, types, poly = _connectivity_from_args(mesh, cells, offsets, celltypes, polyhedra)
    ncells = types.size
    if merge_tol is not None:
        if mesh is None:
            msg = "merge_tol= needs the mesh (its point coordinates); pass the mesh, not cells="
            raise ValueError(msg)
        import pyvista as pv

        weld = weld_points(np.asarray(pv.wrap(mesh).points), conn, off, relative=merge_tol)
        if weld.merged:
            log.info("dual graph: %s", weld.describe())
        conn = weld.apply(conn)
        poly = None if poly is None else poly.renumbered(weld)
    keys, owner = cell_faces(conn, off, types, poly)
    if keys.shape[0] == 0:
        import scipy.sparse as sp

        return sp.csr_matrix((ncells, ncells), dtype=np.int32)
    r, c = shared_face_pairs(keys, owner)
    if r.size == 0:
        import scipy.sparse as sp

        return sp.csr_matrix((ncells, ncells), dtype=np.int32)
    log.debug("dual graph: %d cells, %d shared faces", ncells, r.size)
    return _symmetric_binary(r, c, ncells)


def face_width(types: np.ndarray, polyhedra: PolyhedronFaces | None = None) -> int:
    """Columns of :func:`cell_faces`' rows: 4, or the widest polyhedron face when wider."""
    if polyhedra is None or not (np.asarray(types) == VTK_POLYHEDRON).any():
        return 4
    return max(4, polyhedra.widest_face())


def cell_faces(
    conn: np.ndarray,
    off: np.ndarray,
    types: np.ndarray,
    polyhedra: PolyhedronFaces | None = None,
    *,
    width: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every face of every cell as a padded row of sorted vertex ids, and its cell.

    Parameters
    ----------
    conn, off, types
        Flat connectivity, offsets (ncells + 1) and VTK type of every cell.
    polyhedra : PolyhedronFaces, optional
        The faces of the cells of type 42 (needed when there are any).
    width : int, optional
        Columns of the rows (default :func:`face_width`); ranks that compare faces pass the
        same value.

    Returns
    -------
    keys : ndarray of shape (F, width), int64
        Faces of 3-D cells and edges of 2-D cells (padded with -1 on the left; edges carry
        -2 in column 0 so they never match a triangle face). Equal rows = a shared face.
    cells : ndarray of shape (F,), int64
        Index (into ``types``) of the cell of every face.

    Raises
    ------
    ValueError
        Unsupported VTK cell types (named), cells with the wrong vertex count, polyhedra
        without their faces.
    """
    face_rows: list[np.ndarray] = []
    face_cells: list[np.ndarray] = []
    nvert = np.diff(off)
    need = face_width(types, polyhedra)
    if width is None:
        width = need
    elif width < need:
        msg = f"width={width} is narrower than the widest face ({need} points)"
        raise ValueError(msg)
    for code in unique_int(types).tolist():
        sel = np.flatnonzero(types == code)
        if code == _VTK_POLYGON:
            for nv in unique_int(nvert[sel]).tolist():
                ids = sel[nvert[sel] == nv]
                verts = conn[off[ids][:, None] + np.arange(nv)]
                faces = [(i, (i + 1) % nv) for i in range(nv)]
                _add_faces(verts, ids, faces, 2, face_rows, face_cells, width)
            continue
        if code == VTK_POLYHEDRON:
            if polyhedra is None or polyhedra.n_cells != types.size:
                msg = (
                    f"{sel.size} polyhedral cell(s) (VTK type 42) but no faces for them; pass "
                    "the mesh itself, or polyhedra=PolyhedronFaces(...) with one entry per cell"
                )
                raise ValueError(msg)
            for k, verts, owner in polyhedra.faces_by_size(sel):
                _add_faces(verts, owner, [tuple(range(k))], 3, face_rows, face_cells, width)
            continue
        if code not in CELL_FACES:
            msg = (
                f"unsupported VTK cell type {_vtk_type_name(code)} (code {code}) in "
                f"{sel.size} cell(s); supported: triangle, quad, pixel, polygon, tetra, "
                "hexahedron, voxel, wedge, pyramid, polyhedron (linear cells); convert or drop "
                "the others"
            )
            raise ValueError(msg)
        nv = _CELL_NVERTS[code]
        if (nvert[sel] != nv).any():
            msg = f"cells of VTK type {_vtk_type_name(code)} must have {nv} vertices"
            raise ValueError(msg)
        verts = conn[off[sel][:, None] + np.arange(nv)]
        dim, faces = CELL_FACES[code]
        _add_faces(verts, sel, faces, dim, face_rows, face_cells, width)
    if not face_rows:
        return np.zeros((0, width), dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(face_rows), np.concatenate(face_cells).astype(np.int64)


def shared_face_pairs(keys: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of cells that share a face: every cell with every later cell listing the same
    face row (runs are usually length 2; non-manifold faces give longer runs).

    Parameters
    ----------
    keys : ndarray of shape (F, W)
        Face rows as :func:`cell_faces` makes them.
    cells : ndarray of shape (F,)
        Any cell id of every face row.

    Returns
    -------
    (ndarray, ndarray)
        Cell ids of both sides, one entry per (face, pair).
    """
    if keys.shape[0] < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = _group_equal_rows(keys)
    keys, cells = keys[order], cells[order]
    same = (keys[1:] == keys[:-1]).all(axis=1)
    rows: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    cols: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    run = same.copy()
    d = 1
    while run.any():
        i = np.flatnonzero(run)
        rows.append(cells[i])
        cols.append(cells[i + d])
        d += 1
        if d >= keys.shape[0]:
            break
        run = run[:-1] & same[d - 1 :]
    return np.concatenate(rows), np.concatenate(cols)


_HASH_MIX = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)


def row_hash(keys: np.ndarray) -> np.ndarray:
    """One 64-bit hash per row of ``keys`` (F, W), the same on every process for equal rows.

    The first four columns use fixed multipliers (so 4-wide rows hash as they always have);
    wider rows use further odd multipliers from a splitmix-style sequence.
    """
    k = keys.astype(np.uint64) + np.uint64(2)  # padding ids -2/-1 become 0/1
    h = np.zeros(k.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in range(k.shape[1]):
            mult = _HASH_MIX[col] if col < 4 else (0x9E3779B97F4A7C15 * (col + 1)) & (2**64 - 1)
            h ^= k[:, col] * np.uint64(mult | 1)
            h ^= h >> np.uint64(29)
    return h


def _group_equal_rows(keys: np.ndarray) -> np.ndarray:
    """A permutation that makes equal rows of ``keys`` (F, W) contiguous.

    Sorting one 64-bit hash of each row is ~8x faster than ``np.lexsort`` over four columns.
    Equal rows have equal hashes, so they share a run of the hash order; runs of three or more
    rows (non-manifold faces, or hash collisions) are re-sorted exactly by all columns, so the
    result never depends on the hash being collision-free.
    """
    h = row_hash(keys)
    order = np.argsort(h)
    hs = h[order]
    start = np.empty(hs.size, dtype=bool)
    start[:1] = True
    np.not_equal(hs[1:], hs[:-1], out=start[1:])
    run = np.cumsum(start) - 1
    long = np.bincount(run)[run] >= 3
    if long.any():
        sub = np.flatnonzero(long)  # whole runs, contiguous in hash order
        ks = keys[order[sub]]
        cols = tuple(ks[:, j] for j in range(ks.shape[1] - 1, -1, -1))
        fix = np.lexsort((*cols, hs[sub]))
        order[sub] = order[sub][fix]
    return order


def _add_faces(
    verts: np.ndarray,
    cell_ids: np.ndarray,
    faces: Any,
    dim: int,
    out_rows: list[np.ndarray],
    out_cells: list[np.ndarray],
    width: int,
) -> None:
    """Append the sorted, padded vertex ids of every face of ``verts`` (ncells, nverts)."""
    for face in faces:
        f = np.sort(verts[:, list(face)], axis=1)
        pad = np.full((f.shape[0], width), -1, dtype=np.int64)
        pad[:, width - f.shape[1] :] = f
        if dim == 2:
            pad[:, 0] = -2  # edges never match a (padded) triangle face of a 3-D cell
        out_rows.append(pad)
        out_cells.append(cell_ids)


def _connectivity_from_args(
    mesh: Any, cells: Any, offsets: Any, celltypes: Any, polyhedra: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, PolyhedronFaces | None]:
    """``(conn, offsets, types, polyhedra)`` from a mesh or from flat/2-D cell arrays."""
    if (mesh is None) == (cells is None):
        msg = "pass either a mesh or cells= (with celltypes=, and offsets= for flat arrays)"
        raise ValueError(msg)
    if mesh is not None:
        if polyhedra is not None:
            msg = "polyhedra= goes with cells=; a mesh carries its own polyhedron faces"
            raise ValueError(msg)
        return (*mesh_connectivity(mesh), mesh_polyhedra(mesh))
    conn, off, types = _flat_cells(cells, offsets, celltypes)
    if polyhedra is not None and not isinstance(polyhedra, PolyhedronFaces):
        msg = f"polyhedra must be a PolyhedronFaces, got {type(polyhedra).__name__}"
        raise TypeError(msg)
    if polyhedra is not None:
        polyhedra.check(np.iinfo(np.int64).max, types)  # structure; ids are global here
    return conn, off, types, polyhedra


def _flat_cells(
    cells: Any, offsets: Any, celltypes: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cells = np.asarray(cells)
    if not np.issubdtype(cells.dtype, np.integer):
        msg = f"cells must hold integer vertex ids, got dtype {cells.dtype}"
        raise TypeError(msg)
    if celltypes is None:
        msg = "cells= needs celltypes= (a VTK cell type code, or one per cell)"
        raise ValueError(msg)
    if cells.ndim == 2:
        ncells, nv = cells.shape
        types = np.broadcast_to(np.asarray(celltypes, dtype=np.int64), (ncells,)).copy()
        off = np.arange(ncells + 1, dtype=np.int64) * nv
        return cells.reshape(-1).astype(np.int64), off, types
    if offsets is None:
        msg = "flat cells= needs offsets= (length ncells + 1)"
        raise ValueError(msg)
    off = np.asarray(offsets, dtype=np.int64)
    types = np.asarray(celltypes, dtype=np.int64).reshape(-1)
    if off.ndim != 1 or off.size != types.size + 1 or off[0] != 0 or off[-1] != cells.size:
        msg = (
            f"offsets must have length ncells + 1 = {types.size + 1}, start at 0 and end at "
            f"len(cells) = {cells.size}; got length {off.size}"
        )
        raise ValueError(msg)
    if (np.diff(off) < 0).any():
        msg = "offsets must be non-decreasing"
        raise ValueError(msg)
    return cells.reshape(-1).astype(np.int64), off, types
