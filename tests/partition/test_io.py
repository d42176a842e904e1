from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.partition import read_mesh, read_points
from meshshard.partition.io import cell_centers, load_geometry


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("io")
    grid = pv.ImageData(dimensions=(5, 4, 3)).cast_to_unstructured_grid()
    grid.cell_data["w"] = np.arange(grid.n_cells, dtype=float) + 1
    grid.save(d / "grid.vtu")
    grid.save(d / "grid.vtk")
    sphere = pv.Sphere(theta_resolution=10, phi_resolution=8)
    for ext in ("vtp", "stl", "ply"):
        sphere.save(d / f"s.{ext}")
    np.save(d / "pts.npy", np.random.default_rng(0).random((50, 3)))
    return d, grid, sphere


def _truncate(src, dst):
    b = src.read_bytes()
    dst.write_bytes(b[: len(b) // 2])
    return dst


def test_reads_every_supported_format(files):
    d, grid, sphere = files
    for name in ("grid.vtu", "grid.vtk"):
        m = read_mesh(d / name)
        assert m.n_cells == grid.n_cells
    for ext in ("vtp", "stl", "ply"):
        assert read_mesh(d / f"s.{ext}").n_cells == sphere.n_cells
    assert read_points(d / "pts.npy").shape == (50, 3)
    assert read_points(d / "s.vtp").shape == (sphere.n_points, 3)


def test_cell_centres_and_geometry(files):
    d, grid, _ = files
    m = read_mesh(d / "grid.vtu")
    assert np.allclose(cell_centers(m), m.cell_centers().points)
    g = load_geometry(d / "grid.vtu")
    assert g.on == "cells" and g.points.shape == (grid.n_cells, 3)
    assert np.array_equal(g.field("w"), grid.cell_data["w"])
    assert g.graph().shape == (grid.n_cells,) * 2
    p = load_geometry(d / "grid.vtu", on="points")
    assert p.points.shape == (grid.n_points, 3) and p.graph(knn=4).shape[0] == grid.n_points
    with pytest.raises(ValueError, match=r"no cell field 'nope' \(available: w\)"):
        g.field("nope")
    with pytest.raises(ValueError, match="use --graph knn"):
        p.graph("dual")
    with pytest.raises(ValueError, match="has no cells; use --on points"):
        load_geometry(d / "pts.npy", on="cells")


@pytest.mark.parametrize("name", ["grid.vtu", "s.vtp", "s.stl", "s.ply", "grid.vtk"])
def test_truncated_files_are_named(files, name, tmp_path):
    d, _, _ = files
    bad = _truncate(d / name, tmp_path / f"t_{name}")
    with pytest.raises(ValueError, match=f"t_{name}: (unreadable or truncated|truncated)"):
        read_mesh(bad)


def test_other_bad_files(files, tmp_path):
    d, _, _ = files
    with pytest.raises(FileNotFoundError, match="missing.vtu: no such file"):
        read_mesh(tmp_path / "missing.vtu")
    (tmp_path / "x.obj").write_text("v 0 0 0\n")
    with pytest.raises(ValueError, match=r"unsupported file type '.obj'"):
        read_mesh(tmp_path / "x.obj")
    (tmp_path / "junk.vtu").write_text("not xml")
    with pytest.raises(ValueError, match="junk.vtu: unreadable or truncated"):
        read_mesh(tmp_path / "junk.vtu")
    bad = _truncate(d / "pts.npy", tmp_path / "t.npy")
    with pytest.raises(ValueError, match="t.npy: unreadable or truncated .npy"):
        read_points(bad)
    np.save(tmp_path / "flat.npy", np.zeros(9))
    with pytest.raises(ValueError, match=r"flat.npy: expected points of shape .* found \(9,\)"):
        read_points(tmp_path / "flat.npy")
