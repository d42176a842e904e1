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

from meshshard.io.cells import CELL_FACES, VTK_POLYGON, PolyhedronFaces
from meshshard.partition._validation import (
    as_points,
    check_distance_range,
    check_tree_indices,
)
from meshshard.partition.faces import cell_faces, shared_face_pairs
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
    check_distance_range(pts)
    xs = pts[order]
    tree = cKDTree(xs, balanced_tree=False, compact_nodes=False)
    _, nbr = tree.query(xs, k=k + 1, workers=-1)
    nbr = check_tree_indices(nbr.astype(np.int64, copy=False).reshape(n, k + 1), n)
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
        types = np.full(nv.size, VTK_POLYGON, dtype=np.int64)
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
