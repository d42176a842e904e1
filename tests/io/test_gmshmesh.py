"""The gmsh tunnel volume is a valid, conforming tet mesh, and its dual graph is sound."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from meshshard.io import gmshmesh
from meshshard.partition import dual_graph

_FACES = np.array([[0, 2, 1], [0, 1, 3], [1, 2, 3], [0, 3, 2]])  # outward for positive tets


@pytest.fixture(scope="module")
def mesh():
    pytest.importorskip("gmsh")
    return gmshmesh.tet_volume(3000)


def _signed_volumes(points, tets):
    a, b, c, d = (points[tets[:, i]] for i in range(4))
    return np.einsum("ij,ij->i", np.cross(b - a, c - a), d - a) / 6


def test_valid_tet_mesh(mesh):
    points, tets = mesh
    assert points.dtype == np.float64 and points.shape[1] == 3 and np.isfinite(points).all()
    assert tets.dtype == np.int64 and tets.shape[1] == 4 and len(tets) > 1000
    assert tets.min() == 0 and tets.max() == len(points) - 1
    assert len(np.unique(tets)) == len(points)  # no orphan points
    assert (np.sort(tets, axis=1)[:, 1:] != np.sort(tets, axis=1)[:, :-1]).all()
    vol = _signed_volumes(points, tets)
    assert (vol > 0).all()  # positively oriented, none degenerate
    # conforming: every face is shared by one tet (boundary) or two (interior), never more
    faces = tets[:, _FACES].reshape(-1, 3)
    key, count = np.unique(np.sort(faces, axis=1), axis=0, return_counts=True)
    assert count.max() == 2
    boundary = faces[np.isin(_rows(np.sort(faces, axis=1)), _rows(key[count == 1]))]
    # the boundary is closed (every edge in two boundary triangles) and encloses the tet volume
    edges = np.sort(boundary[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2), axis=1)
    assert (np.unique(edges, axis=0, return_counts=True)[1] == 2).all()
    p0, p1, p2 = (points[boundary[:, i]] for i in range(3))
    area_vec = np.cross(p1 - p0, p2 - p0) / 2
    assert np.abs(area_vec.sum(axis=0)).max() < 1e-9 * np.abs(area_vec).sum()
    div_volume = np.einsum("ij,ij->", p0, area_vec) / 3
    assert div_volume == pytest.approx(vol.sum(), rel=1e-9)
    # boundary faces on the tunnel walls cover them exactly; the others lie on the car
    lo = np.array(gmshmesh._TUNNEL[0])
    hi = lo + np.array(gmshmesh._TUNNEL[1])
    tri = points[boundary]
    on_wall = ((np.abs(tri - lo) < 1e-9).all(axis=1) | (np.abs(tri - hi) < 1e-9).all(axis=1)).any(
        axis=1
    )
    ext = np.array(gmshmesh._TUNNEL[1])
    wall_area = 2 * (ext[0] * ext[1] + ext[1] * ext[2] + ext[0] * ext[2])
    assert np.linalg.norm(area_vec[on_wall], axis=1).sum() == pytest.approx(wall_area, rel=1e-9)
    car = tri[~on_wall].reshape(-1, 3)
    assert len(car) > 0
    assert (car.min(axis=0) > [-2.31, -0.96, 0.11]).all()
    assert (car.max(axis=0) < [2.31, 0.96, 1.66]).all()
    assert vol.sum() < np.prod(ext) - 2.0  # the car (several m^3) is cut out
    # graded: faces on the car (size h) are much smaller than on the tunnel walls (up to 4 h)
    areas = np.linalg.norm(area_vec, axis=1)
    assert areas[~on_wall].mean() < 0.5 * areas[on_wall].mean()


def _rows(a):
    return np.ascontiguousarray(a).view(np.dtype((np.void, a.dtype.itemsize * a.shape[1])))[:, 0]


def test_dual_graph(mesh):
    points, tets = mesh
    adj = dual_graph(cells=tets, celltypes=10)
    assert adj.shape == (len(tets), len(tets))
    assert (adj != adj.T).nnz == 0  # symmetric
    assert adj.diagonal().sum() == 0
    deg = np.diff(adj.indptr)
    assert deg.max() <= 4 and deg.min() >= 1
    faces = np.sort(tets[:, _FACES].reshape(-1, 3), axis=1)
    interior = (np.unique(faces, axis=0, return_counts=True)[1] == 2).sum()
    assert adj.nnz == 2 * interior  # one edge per shared face, each direction
    assert connected_components(sp.csr_matrix(adj), directed=False)[0] == 1


def test_cache_round_trip(tmp_path, monkeypatch, mesh):
    points, tets = gmshmesh.tet_volume(3000, cache_dir=tmp_path)
    np.testing.assert_array_equal(tets, mesh[1])  # deterministic
    np.testing.assert_array_equal(points, mesh[0])

    def boom(h):
        raise AssertionError("meshed again instead of reading the cache")

    monkeypatch.setattr(gmshmesh, "_mesh", boom)
    p2, t2 = gmshmesh.tet_volume(3000, cache_dir=tmp_path)
    np.testing.assert_array_equal(t2, tets)
    np.testing.assert_array_equal(p2, points)
    assert not list(tmp_path.glob("*.tmp*"))


def test_errors(monkeypatch):
    with pytest.raises(ValueError, match="cells=10 is too small"):
        gmshmesh.tet_volume(10)
    monkeypatch.setitem(sys.modules, "gmsh", None)  # as if gmsh were not installed
    with pytest.raises(ImportError, match=r"pip install -e '\.\[mesh\]'"):
        gmshmesh.tet_volume(5000)
