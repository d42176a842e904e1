from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import pyvista as pv

from meshshard.datasets import DRIVAERML, DatasetSchema, FieldSpec, read_run
from meshshard.datasets.drivaerml import file_fingerprint

U, RHO = 38.889, 1.0


@pytest.fixture
def run_copy(runs_src, tmp_path):
    dst = tmp_path / "run_1"
    shutil.copytree(runs_src / "run_1", dst)
    return dst


def test_values_equal_the_vtk_arrays_made_dimensionless(runs_src):
    data = read_run(runs_src / "run_1")
    surf = pv.read(runs_src / "run_1" / "boundary_1.vtp")
    vol = pv.read(runs_src / "run_1" / "volume_1.vtu")
    stl = pv.read(runs_src / "run_1" / "drivaer_1.stl")
    length = float(stl.bounds[1] - stl.bounds[0])
    assert data.length == pytest.approx(length)
    s = data.surface
    assert s.columns == {
        "pMeanTrim": [0, 1],
        "wallShearStressMeanTrim": [1, 4],
        "CpMeanTrim": [4, 5],
    }
    np.testing.assert_allclose(
        s.fields[:, 0], surf.cell_data["pMeanTrim"] / (RHO * U**2), rtol=1e-6
    )
    np.testing.assert_allclose(
        s.fields[:, 1:4], surf.cell_data["wallShearStressMeanTrim"] / (RHO * U**2), rtol=1e-6
    )
    np.testing.assert_array_equal(s.fields[:, 4], surf.cell_data["CpMeanTrim"])
    np.testing.assert_allclose(s.centers, surf.cell_centers().points, atol=1e-6)
    np.testing.assert_allclose(s.areas, surf.compute_cell_sizes()["Area"], rtol=1e-5)
    np.testing.assert_array_equal(s.source_index, np.arange(surf.n_cells))
    v = data.volume
    np.testing.assert_allclose(v.fields[:, 0:3], vol.cell_data["UMeanTrim"] / U, rtol=1e-6)
    np.testing.assert_allclose(v.fields[:, 3], vol.cell_data["pMeanTrim"] / (RHO * U**2), rtol=1e-6)
    np.testing.assert_allclose(
        v.fields[:, 4], vol.cell_data["nutMeanTrim"] / (U * length), rtol=1e-5
    )
    np.testing.assert_allclose(v.centers, vol.cell_centers().points, atol=2e-6)
    assert data.stl.faces.shape == (stl.n_cells, 3)
    np.testing.assert_allclose(data.stl.areas, stl.compute_cell_sizes()["Area"], rtol=1e-5)
    assert set(data.sources) == {"surface", "volume", "stl"}
    assert data.sources["surface"] == file_fingerprint(runs_src / "run_1" / "boundary_1.vtp")


def test_constants_are_configurable(runs_src):
    schema = replace(DRIVAERML, u_inf=10.0, rho=1.2)
    data = read_run(runs_src / "run_1", schema=schema, volume=False)
    surf = pv.read(runs_src / "run_1" / "boundary_1.vtp")
    np.testing.assert_allclose(
        data.surface.fields[:, 0], surf.cell_data["pMeanTrim"] / 120.0, rtol=1e-6
    )
    assert data.volume is None


def test_other_field_names_via_schema(run_copy):
    mesh = pv.read(run_copy / "boundary_1.vtp")
    mesh.cell_data["p"] = mesh.cell_data["pMeanTrim"]
    mesh.save(run_copy / "boundary_1.vtp")
    schema = replace(DRIVAERML, surface_fields=(FieldSpec("p", "raw"),))
    data = read_run(run_copy, schema=schema, volume=False)
    np.testing.assert_array_equal(data.surface.fields[:, 0], mesh.cell_data["pMeanTrim"])
    with pytest.raises(ValueError, match="kind='pressur'"):
        FieldSpec("p", "pressur")


def test_volume_subsample_keeps_the_named_cells(runs_src):
    data = read_run(runs_src / "run_1", surface=False, max_volume_cells=300, seed=3)
    vol = pv.read(runs_src / "run_1" / "volume_1.vtu")
    idx = data.volume.source_index
    assert idx.size == 300 and np.all(np.diff(idx) > 0)
    np.testing.assert_allclose(data.volume.centers, vol.cell_centers().points[idx], atol=2e-6)
    np.testing.assert_allclose(
        data.volume.fields[:, 0:3], vol.cell_data["UMeanTrim"][idx] / U, rtol=1e-6
    )
    again = read_run(runs_src / "run_1", surface=False, max_volume_cells=300, seed=3)
    np.testing.assert_array_equal(again.volume.source_index, idx)


def test_missing_file_is_named(run_copy):
    (run_copy / "volume_1.vtu").unlink()
    with pytest.raises(FileNotFoundError, match=r"volume_1\.vtu: missing volume file"):
        read_run(run_copy)
    read_run(run_copy, volume=False)  # the surface alone still reads


def test_missing_stl_only_matters_for_nut(run_copy):
    (run_copy / "drivaer_1.stl").unlink()
    assert read_run(run_copy, volume=False).stl is None
    with pytest.raises(ValueError, match=r"nut needs a length scale: provide the run's STL"):
        read_run(run_copy)
    data = read_run(run_copy, schema=replace(DRIVAERML, length=4.6))
    assert data.length == 4.6


def test_missing_field_is_named(run_copy):
    mesh = pv.read(run_copy / "boundary_1.vtp")
    del mesh.cell_data["wallShearStressMeanTrim"]
    mesh.save(run_copy / "boundary_1.vtp")
    with pytest.raises(
        ValueError, match=r"boundary_1\.vtp: cell field\(s\) \['wallShearStressMeanTrim'\] missing"
    ):
        read_run(run_copy)
    # optional fields may be absent
    mesh = pv.read(run_copy / "boundary_1.vtp")
    mesh.cell_data["wallShearStressMeanTrim"] = np.zeros((mesh.n_cells, 3), np.float32)
    del mesh.cell_data["CpMeanTrim"]
    mesh.save(run_copy / "boundary_1.vtp")
    assert list(read_run(run_copy, volume=False).surface.columns) == [
        "pMeanTrim",
        "wallShearStressMeanTrim",
    ]


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_truncated_or_corrupt_vtk(run_copy, damage):
    f = run_copy / "volume_1.vtu"
    raw = f.read_bytes()
    f.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else b"\x00\xffnot vtk" * 100)
    with pytest.raises(
        ValueError, match=r"volume_1\.vtu: (truncated or corrupt VTK( XML)? file|has 0 cells)"
    ):
        read_run(run_copy)


def test_zero_cells(run_copy):
    empty = pv.PolyData()
    empty.SetPoints(pv.vtk_points(np.zeros((3, 3), np.float32)))  # points, no cells
    from vtkmodules.vtkCommonCore import vtkFloatArray

    for name, k in (("pMeanTrim", 1), ("CpMeanTrim", 1), ("wallShearStressMeanTrim", 3)):
        arr = vtkFloatArray()  # pyvista refuses empty arrays; VTK writes them
        arr.SetName(name)
        arr.SetNumberOfComponents(k)
        empty.GetCellData().AddArray(arr)
    empty.save(run_copy / "boundary_1.vtp")
    with pytest.raises(ValueError, match=r"boundary_1\.vtp: has 0 cells"):
        read_run(run_copy, volume=False)


def test_nan_values_are_counted_and_can_be_dropped(run_copy):
    mesh = pv.read(run_copy / "boundary_1.vtp")
    p = mesh.cell_data["pMeanTrim"].copy()
    p[[3, 10, 11]] = np.nan
    mesh.cell_data["pMeanTrim"] = p
    mesh.save(run_copy / "boundary_1.vtp")
    with pytest.raises(
        ValueError, match=r"boundary_1\.vtp: non-finite .* pMeanTrim: 3 cells .*--drop-nan"
    ):
        read_run(run_copy, volume=False)
    data = read_run(run_copy, volume=False, drop_nan=True)
    s = data.surface
    assert s.dropped_nan == 3 and s.centers.shape[0] == mesh.n_cells - 3
    assert not np.isin([3, 10, 11], s.source_index).any()
    np.testing.assert_allclose(s.centers, mesh.cell_centers().points[s.source_index], atol=1e-6)
    assert np.isfinite(s.fields).all()


def test_bad_run_directory_name(tmp_path):
    (tmp_path / "case7").mkdir()
    with pytest.raises(ValueError, match="must be named run_<number>"):
        read_run(tmp_path / "case7")


def test_schema_validation():
    with pytest.raises(ValueError, match="u_inf=0"):
        DatasetSchema(u_inf=0)


@pytest.mark.parametrize("mode", ["binary", "appended-raw"])
def test_meshshard_and_vtk_readers_agree(run_copy, monkeypatch, mode):
    """The default (meshshard's XML reader) and MESHSHARD_READER=vtk give the same run."""
    from vtkmodules import vtkIOXML

    from meshshard.io.vtkxml import read_cells

    for name, cls in (("boundary_1.vtp", "vtkXMLPolyDataWriter"),
                      ("volume_1.vtu", "vtkXMLUnstructuredGridWriter")):
        w = getattr(vtkIOXML, cls)()
        w.SetInputData(pv.read(run_copy / name))
        w.SetFileName(str(run_copy / name))
        w.SetDataModeToBinary() if mode == "binary" else w.SetDataModeToAppended()
        w.SetEncodeAppendedData(False)
        w.Write()
        read_cells(run_copy / name, [])  # the default path really is meshshard's reader here
    ours = read_run(run_copy)
    monkeypatch.setenv("MESHSHARD_READER", "vtk")
    theirs = read_run(run_copy)
    for part in ("surface", "volume"):
        a, b = getattr(ours, part), getattr(theirs, part)
        keys = ["centers", "fields", "source_index"] + ["normals", "areas"] * (part == "surface")
        for key in keys:
            np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=f"{part}.{key}")
        assert a.columns == b.columns and a.scales == b.scales
    assert ours.sources == theirs.sources


def _rewrite_volume(run_dir, mode, compressor, block):
    from vtkmodules import vtkIOXML

    w = vtkIOXML.vtkXMLUnstructuredGridWriter()
    w.SetInputData(pv.read(run_dir / "volume_1.vtu"))
    w.SetFileName(str(run_dir / "volume_1.vtu"))
    w.SetDataModeToBinary() if mode == "binary" else w.SetDataModeToAppended()
    w.SetEncodeAppendedData(mode == "appended-base64")
    getattr(w, f"SetCompressorTypeTo{compressor}")()
    w.SetBlockSize(block)  # 1000 bytes: blocks end inside rows of UMeanTrim (12 bytes each)
    assert w.Write() == 1


@pytest.mark.parametrize("mode", ["binary", "appended-raw", "appended-base64"])
@pytest.mark.parametrize("compressor", ["None", "ZLib"])
@pytest.mark.parametrize("max_cells", [None, 123])
def test_streamed_volume_equals_the_vtk_read(
    run_copy, monkeypatch, caplog, mode, compressor, max_cells
):
    """Volumes are read in small pieces (rows and ids cut anywhere), equal to VTK's read."""
    import logging

    from meshshard.datasets import drivaerml
    from meshshard.datasets.drivaerml import read_volume

    _rewrite_volume(run_copy, mode, compressor, 1000)
    monkeypatch.setattr(drivaerml, "_PIECE_ROWS", 37)
    monkeypatch.setattr(drivaerml, "_PIECE_IDS", 101)
    path = run_copy / "volume_1.vtu"
    with caplog.at_level(logging.DEBUG, logger="meshshard.datasets.drivaerml"):
        ours = read_volume(path, length=4.5, max_cells=max_cells, seed=2)
    assert "read with VTK" not in caplog.text  # the streamed path really ran
    monkeypatch.setenv("MESHSHARD_READER", "vtk")
    theirs = read_volume(path, length=4.5, max_cells=max_cells, seed=2)
    for key in ("centers", "fields", "source_index"):
        np.testing.assert_array_equal(getattr(ours, key), getattr(theirs, key), err_msg=key)
    assert ours.columns == theirs.columns and ours.n_source_cells == theirs.n_source_cells


def test_streamed_volume_names_missing_fields_and_drops_nans(run_copy, monkeypatch):
    from meshshard.datasets import drivaerml
    from meshshard.datasets.drivaerml import read_volume

    monkeypatch.setattr(drivaerml, "_PIECE_ROWS", 50)
    grid = pv.read(run_copy / "volume_1.vtu")
    grid.cell_data["pMeanTrim"][[3, 200]] = np.nan
    grid.save(run_copy / "volume_1.vtu")
    with pytest.raises(ValueError, match=r"non-finite .* pMeanTrim: 2 cells"):
        read_volume(run_copy / "volume_1.vtu", length=4.5)
    got = read_volume(run_copy / "volume_1.vtu", length=4.5, drop_nan=True)
    assert got.dropped_nan == 2 and 3 not in got.source_index and 200 not in got.source_index
    del grid.cell_data["nutMeanTrim"]
    grid.save(run_copy / "volume_1.vtu")
    with pytest.raises(ValueError, match=r"cell field\(s\) \['nutMeanTrim'\] missing"):
        read_volume(run_copy / "volume_1.vtu", length=4.5)
