from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.datasets import make_synthetic_run


def test_layout_names_and_fields(runs_src):
    run = runs_src / "run_1"
    assert sorted(p.name for p in run.iterdir()) == [
        "boundary_1.vtp",
        "drivaer_1.stl",
        "volume_1.vtu",
    ]
    surf = pv.read(run / "boundary_1.vtp")
    assert {"pMeanTrim", "wallShearStressMeanTrim", "CpMeanTrim"} <= set(surf.cell_data)
    assert abs(surf.n_cells - 3000) / 3000 < 0.1
    vol = pv.read(run / "volume_1.vtu")
    assert {"UMeanTrim", "pMeanTrim", "nutMeanTrim"} <= set(vol.cell_data)
    assert abs(vol.n_cells - 2000) / 2000 < 0.2
    stl = pv.read(run / "drivaer_1.stl")
    assert stl.is_all_triangles and stl.n_cells > 0


def test_body_is_closed_in_openfoam_conventions_and_fields_are_physical(runs_src):
    surf = pv.read(runs_src / "run_1" / "boundary_1.vtp")
    assert surf.n_open_edges == 0
    counts = np.diff(surf.GetPolys().GetOffsetsArray())
    assert (counts == 4).mean() > 0.9  # mostly quads
    n = surf.compute_normals(cell_normals=True, point_normals=False, consistent_normals=False)
    normals = n.cell_data["Normals"]
    centres = surf.cell_centers().points
    area = surf.compute_cell_sizes()["Area"]
    # OpenFOAM's: normals into the body (negative signed volume), shear on the fluid
    assert np.sum(np.sum(normals * centres, axis=1) * area) < 0
    cp = surf.cell_data["CpMeanTrim"]
    front = centres[:, 0] < centres[:, 0].min() + 0.05
    roof = (normals[:, 2] < -0.95) & (np.abs(centres[:, 0]) < 0.5)
    assert cp[front].max() > 0.9  # stagnation
    assert cp[roof].mean() < -0.5  # suction on the roof
    wss = surf.cell_data["wallShearStressMeanTrim"]
    tang = np.abs(np.sum(wss * normals, axis=1)) / np.maximum(np.linalg.norm(wss, axis=1), 1e-12)
    assert tang.max() < 1e-3  # tangential
    # the stress on the fluid points against the free stream (+x) on the roof
    assert np.mean(wss[roof, 0]) < 0
    np.testing.assert_allclose(surf.cell_data["pMeanTrim"], 0.5 * 38.889**2 * cp, rtol=1e-5)


def test_volume_is_graded_towards_the_body(runs_src):
    vol = pv.read(runs_src / "run_1" / "volume_1.vtu").compute_cell_sizes()
    surf = pv.read(runs_src / "run_1" / "boundary_1.vtp")
    from scipy.spatial import cKDTree

    d, _ = cKDTree(surf.cell_centers().points).query(vol.cell_centers().points)
    near, far = vol["Volume"][d < np.quantile(d, 0.2)], vol["Volume"][d > np.quantile(d, 0.8)]
    assert np.median(near) * 20 < np.median(far)
    speed = np.linalg.norm(vol.cell_data["UMeanTrim"], axis=1)
    assert np.median(speed[d < np.quantile(d, 0.1)]) < 0.5 * np.median(speed[d > 1.0])


def test_deterministic_and_seeded(tmp_path):
    a = make_synthetic_run(tmp_path / "a", 3, surface_cells=500, volume_cells=300, seed=7)
    b = make_synthetic_run(tmp_path / "b", 3, surface_cells=500, volume_cells=300, seed=7)
    c = make_synthetic_run(tmp_path / "c", 3, surface_cells=500, volume_cells=300, seed=8)
    ra, rb, rc = (pv.read(r.surface) for r in (a, b, c))
    np.testing.assert_array_equal(ra.cell_data["pMeanTrim"], rb.cell_data["pMeanTrim"])
    assert not np.array_equal(ra.cell_data["pMeanTrim"], rc.cell_data["pMeanTrim"])
    assert a.volume is not None and a.stl is not None


def test_optional_parts_and_bad_size(tmp_path):
    r = make_synthetic_run(tmp_path, 1, surface_cells=200, volume_cells=0, stl_cells=0)
    assert r.volume is None and r.stl is None and r.surface.is_file()
    with pytest.raises(ValueError, match="cells=4 is too small"):
        make_synthetic_run(tmp_path, 2, surface_cells=4)
