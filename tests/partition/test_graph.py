from __future__ import annotations

import itertools

import numpy as np
import pytest
import pyvista as pv

from meshshard.partition import dual_graph, knn_graph
from meshshard.partition.graph import CELL_FACES, knn_graph_sorted, mesh_connectivity


def _edges(g) -> set[tuple[int, int]]:
    r, c = g.nonzero()
    return {(int(a), int(b)) for a, b in zip(r, c)}


def test_knn_graph_matches_brute_force_union():
    pts = np.random.default_rng(0).random((300, 3))
    k = 5
    g = knn_graph(pts, k)
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    np.fill_diagonal(d, np.inf)
    nn = np.argsort(d, axis=1)[:, :k]
    want = set()
    for i in range(300):
        for j in nn[i]:
            want |= {(i, int(j)), (int(j), i)}
    assert _edges(g) == want
    assert set(np.unique(g.data).tolist()) == {1}
    gs, order = knn_graph_sorted(pts, k)
    inv = np.argsort(order)
    assert (gs[inv][:, inv] != g).nnz == 0


def test_knn_graph_duplicates_small_and_2d():
    pts = np.zeros((6, 2))  # all duplicates: the point itself may not come first
    g = knn_graph(pts, 3)
    assert g.diagonal().sum() == 0
    assert (np.diff(g.indptr) >= 3).all()
    assert knn_graph(np.random.default_rng(1).random((3, 3)), 8).nnz == 6  # k capped at N-1
    assert knn_graph(np.zeros((0, 3)), 4).shape == (0, 0)
    with pytest.raises(ValueError, match="k=0 must be an int >= 1"):
        knn_graph(pts, 0)


def _oracle_dual(conn, off, types) -> set[tuple[int, int]]:
    """Cells i, j adjacent when j contains all vertices of some face (edge in 2-D) of i."""
    cells = [conn[off[i] : off[i + 1]].tolist() for i in range(len(types))]
    faces = []
    for c, t in zip(cells, types):
        if t == 7:
            fs = [(c[i], c[(i + 1) % len(c)]) for i in range(len(c))]
        else:
            fs = [tuple(c[v] for v in f) for f in CELL_FACES[int(t)][1]]
        faces.append({frozenset(f) for f in fs})
    out = set()
    for i, j in itertools.combinations(range(len(cells)), 2):
        if faces[i] & faces[j]:
            out |= {(i, j), (j, i)}
    return out


def _check(mesh):
    g = dual_graph(mesh)
    conn, off, types = mesh_connectivity(mesh)
    assert _edges(g) == _oracle_dual(conn, off, types)
    return g


def test_dual_graph_voxels_hexes_and_tets():
    grid = pv.ImageData(dimensions=(4, 3, 3)).cast_to_unstructured_grid()  # voxels
    g = _check(grid)
    assert g.shape == (12, 12) and g.nnz == 2 * (2 * 2 * 2 + 3 * 1 * 2 + 3 * 2 * 1)
    hexes = grid.copy()
    conn = hexes.cell_connectivity.reshape(-1, 8)[:, [0, 1, 3, 2, 4, 5, 7, 6]]
    hexes = pv.UnstructuredGrid({pv.CellType.HEXAHEDRON: conn}, grid.points)
    assert (dual_graph(hexes) != g).nnz == 0
    tets = pv.PolyData(np.random.default_rng(2).random((40, 3))).delaunay_3d()
    assert set(np.unique(tets.celltypes)) == {10}
    _check(tets)


def test_dual_graph_mixed_3d_cells():
    pts = np.array(
        [[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1], [1, 1, 1], [0, 1, 1],
         [0.5, 0.5, 1.5], [2, 0, 0], [2, 0, 1], [0.5, -0.5, 1.2]],
        dtype=float,
    )  # fmt: skip
    cells = {
        pv.CellType.HEXAHEDRON: np.array([[0, 1, 2, 3, 4, 5, 6, 7]]),
        pv.CellType.PYRAMID: np.array([[4, 5, 6, 7, 8]]),
        pv.CellType.WEDGE: np.array([[1, 9, 2, 5, 10, 6]]),
        pv.CellType.TETRA: np.array([[4, 5, 8, 11]]),
    }
    mesh = pv.UnstructuredGrid(cells, pts)
    g = _check(mesh)
    assert g.nnz == 6  # hex-pyramid, hex-wedge, pyramid-tet; wedge and pyramid share an edge


def test_dual_graph_surfaces_and_raw_arrays():
    _check(pv.Sphere(theta_resolution=12, phi_resolution=8))  # triangles
    quads = pv.Plane(i_resolution=4, j_resolution=3)
    g = _check(quads)
    assert g.shape == (12, 12)
    pts = np.random.default_rng(3).random((9, 3))
    faces = np.hstack([[3, 0, 1, 2], [4, 1, 3, 4, 2], [5, 3, 5, 6, 7, 4], [3, 7, 8, 6]])
    g = _check(pv.PolyData(pts, faces))
    assert g.nnz == 6  # tri-quad (edge 1-2), quad-pentagon (3-4), pentagon-tri (6-7)
    flat = dual_graph(
        cells=np.array([0, 1, 2, 1, 3, 4, 2]),
        offsets=np.array([0, 3, 7]),
        celltypes=np.array([5, 9]),
    )
    assert _edges(flat) == {(0, 1), (1, 0)}
    both = dual_graph(cells=np.array([[0, 1, 2], [2, 1, 3], [4, 5, 6]]), celltypes=5)
    assert _edges(both) == {(0, 1), (1, 0)}


def test_dual_graph_errors_name_the_problem():
    line = pv.UnstructuredGrid({pv.CellType.LINE: np.array([[0, 1]])}, np.eye(3)[:2])
    with pytest.raises(ValueError, match=r"unsupported VTK cell type LINE \(code 3\) in 1 cell"):
        dual_graph(line)
    with pytest.raises(ValueError, match="QUADRATIC_TETRA"):
        dual_graph(cells=np.arange(10)[None], celltypes=24)
    lines = pv.PolyData(np.eye(3), lines=[2, 0, 1])
    with pytest.raises(ValueError, match="1 lines besides its polygons"):
        dual_graph(lines)
    with pytest.raises(ValueError, match="offsets must have length ncells \\+ 1 = 3"):
        dual_graph(cells=np.arange(7), offsets=[0, 7], celltypes=[5, 9])
    with pytest.raises(ValueError, match="either a mesh or cells="):
        dual_graph()
