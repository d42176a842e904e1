from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.io.geometry import (
    cell_centres,
    polygon_geometry,
    streamed_centres,
    vtk_cells,
)


def _mixed_polydata() -> pv.PolyData:
    """Triangles, quads and a pentagon, interleaved (not contiguous by size), non-planar quad."""
    rng = np.random.default_rng(0)
    pts = rng.random((40, 3)).astype(np.float32)
    cells = [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14], [15, 16, 17, 18], [1, 5, 9]]
    faces = np.concatenate([[len(c), *c] for c in cells])
    return pv.PolyData(pts, faces)


def _check(mesh):
    pts = np.asarray(mesh.points)
    off, conn = vtk_cells(mesh.GetPolys())
    centres, normals, areas = polygon_geometry(pts, off, conn)
    np.testing.assert_allclose(centres, mesh.cell_centers().points, atol=1e-6)
    ref = mesh.compute_normals(
        cell_normals=True, point_normals=False, auto_orient_normals=False, consistent_normals=False
    )
    np.testing.assert_allclose(normals, ref.cell_data["Normals"], atol=1e-5)
    sizes = mesh.compute_cell_sizes(length=False, volume=False)
    np.testing.assert_allclose(areas, sizes.cell_data["Area"], rtol=1e-5, atol=1e-7)


def test_polygon_geometry_matches_vtk_on_mixed_cells():
    mesh = _mixed_polydata()
    # the non-planar quad makes VTK's area differ from the vector area: compare planar only
    planar = mesh.extract_cells([0, 2, 5]).extract_surface(algorithm="dataset_surface")
    _check(planar)
    pts = np.asarray(mesh.points)
    off, conn = vtk_cells(mesh.GetPolys())
    centres, normals, areas = polygon_geometry(pts, off, conn)
    # VTK's centre of a general polygon is a parametric point, not the vertex mean: we use the
    # vertex mean for every cell (equal to VTK's for triangles and quads)
    not_pent = [0, 1, 2, 4, 5]
    np.testing.assert_allclose(centres[not_pent], mesh.cell_centers().points[not_pent], atol=1e-6)
    np.testing.assert_allclose(centres[3], pts[10:15].mean(axis=0), atol=1e-6)
    # the vector area of any polygon equals the sum over its fan triangles
    pent = pts[[10, 11, 12, 13, 14]].astype(np.float64)
    vec = sum(np.cross(pent[j] - pent[0], pent[j + 1] - pent[0]) for j in range(1, 4)) / 2
    np.testing.assert_allclose(areas[3], np.linalg.norm(vec), rtol=1e-5)
    np.testing.assert_allclose(normals[3], vec / np.linalg.norm(vec), atol=1e-5)


def test_geometry_matches_vtk_on_generated_run(runs_src):
    _check(pv.read(runs_src / "run_1" / "boundary_1.vtp"))


@pytest.mark.parametrize("subset", [False, True])
def test_cell_centres_of_volume_match_vtk(runs_src, subset):
    grid = pv.read(runs_src / "run_1" / "volume_1.vtu")  # hexes and wedges
    off, conn = vtk_cells(grid.GetCells())
    ref = np.asarray(grid.cell_centers().points)
    cells = np.array([5, 0, grid.n_cells - 1, 17]) if subset else None
    got = cell_centres(np.asarray(grid.points), off, conn, cells)
    np.testing.assert_allclose(got, ref if cells is None else ref[cells], atol=2e-6)


def test_blocks_give_the_same_answer():
    mesh = _mixed_polydata()
    pts = np.asarray(mesh.points)
    off, conn = vtk_cells(mesh.GetPolys())
    a = polygon_geometry(pts, off, conn)
    b = polygon_geometry(pts, off, conn, block=1, threads=3)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("subset", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streamed_centres_equal_whole_for_any_cuts(runs_src, subset, seed):
    """Connectivity cut anywhere (inside cells, empty pieces, one id at a time) gives the
    centres of the whole array."""
    grid = pv.read(runs_src / "run_1" / "volume_1.vtu")
    off, conn = vtk_cells(grid.GetCells())
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(conn.size, size=40, replace=True))
    cuts = np.concatenate([[0], cuts, [conn.size]])
    if seed == 2:
        cuts = np.arange(conn.size + 1)[:200].tolist() + [conn.size]  # 1-id pieces, then rest
    pieces = [(int(a), conn[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    cells = np.sort(rng.choice(grid.n_cells, 50, replace=False)) if subset else None
    pts = np.asarray(grid.points)
    want = cell_centres(pts, off, conn, cells)
    np.testing.assert_array_equal(streamed_centres(pts, off, iter(pieces), cells), want)


def test_streamed_centres_refuse_short_connectivity(runs_src):
    grid = pv.read(runs_src / "run_1" / "volume_1.vtu")
    off, conn = vtk_cells(grid.GetCells())
    with pytest.raises(ValueError, match="pieces cover"):
        streamed_centres(np.asarray(grid.points), off, iter([(0, conn[:-3])]))
