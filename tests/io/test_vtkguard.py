"""Files of several pieces are read by meshshard's reader and merged as VTK merges them; what
goes to VTK is validated first and what comes back is checked against the XML's counts."""

from __future__ import annotations

import numpy as np
import pytest

from meshshard.datasets.drivaerml import read_surface, read_volume
from meshshard.io.vtkguard import check_before_vtk, check_vtk_output, read_all_pieces
from meshshard.io.vtkxml import CellMesh, CorruptVtkXml, SeveralPieces, read_cells
from tests.pipelines._damage import (
    set_array_attr,
    set_attr,
    surface_mesh,
    volume_mesh,
    write_two_pieces,
    write_vtk,
)


@pytest.mark.parametrize("compressor", ["None", "ZLib", "LZ4"])
@pytest.mark.parametrize("suffix", [".vtp", ".vtu"])
def test_pieces_merge_like_vtk(tmp_path, suffix, compressor):
    import pyvista as pv

    mesh = surface_mesh() if suffix == ".vtp" else volume_mesh()
    path = write_two_pieces(mesh, tmp_path / f"two{suffix}", compressor)
    with pytest.raises(SeveralPieces):
        read_cells(path, ["pMeanTrim"])
    got = read_all_pieces(path, ["pMeanTrim", "absent"])
    ref = pv.read(path)
    assert got.n_cells == ref.n_cells == 2 * mesh.n_cells
    np.testing.assert_array_equal(got.points, ref.points)
    cells = ref.GetPolys() if suffix == ".vtp" else ref.GetCells()
    np.testing.assert_array_equal(got.offsets, np.asarray(cells.GetOffsetsArray()))
    np.testing.assert_array_equal(got.connectivity, np.asarray(cells.GetConnectivityArray()))
    np.testing.assert_array_equal(got.cell_data["pMeanTrim"], ref.cell_data["pMeanTrim"])
    assert "absent" not in got.cell_data


@pytest.mark.parametrize("suffix", [".vtp", ".vtu"])
def test_two_piece_run_reads_the_same_with_either_reader(tmp_path, suffix, monkeypatch):
    mesh = surface_mesh() if suffix == ".vtp" else volume_mesh()
    path = write_two_pieces(mesh, tmp_path / f"two{suffix}", "ZLib")
    read = read_surface if suffix == ".vtp" else (lambda p: read_volume(p, length=1.0))
    own = read(path)
    monkeypatch.setenv("MESHSHARD_READER", "vtk")
    vtk = read(path)
    assert own.n_source_cells == vtk.n_source_cells == 2 * mesh.n_cells
    np.testing.assert_array_equal(own.fields, vtk.fields)
    np.testing.assert_allclose(own.centers, vtk.centers, rtol=1e-6)


def test_header_check_refuses_what_vtk_would_misread(tmp_path):
    mesh = surface_mesh()
    raw = write_vtk(mesh, tmp_path / "a.vtp", "appended-raw", "None").read_bytes()
    assert check_before_vtk(tmp_path / "a.vtp", ["pMeanTrim"]) == (mesh.n_points, mesh.n_cells)
    bad = tmp_path / "neg.vtp"
    bad.write_bytes(set_array_attr(raw, "pMeanTrim", "offset", -8))
    with pytest.raises(CorruptVtkXml, match=r"neg\.vtp: .*offset=-8 outside the appended data"):
        check_before_vtk(bad, ["pMeanTrim"])
    # a field VTK would not read (disabled) is not checked
    check_before_vtk(bad, ["wallShearStressMeanTrim"])
    # connectivity shorter than the offsets say: VTK would read past it
    conn = tmp_path / "conn.vtp"
    polys = raw.index(b"<Polys>")
    head, tail = raw[:polys], raw[polys:]
    moved = set_array_attr(tail, "offsets", "offset", _offset(tail, "connectivity"))
    conn.write_bytes(head + moved)
    with pytest.raises(CorruptVtkXml, match=r"conn\.vtp: "):
        check_before_vtk(conn, [])


def _offset(raw: bytes, name: str) -> int:
    import re

    tag = re.search(rb'<DataArray[^>]*Name="' + name.encode() + rb'"[^>]*>', raw).group(0)
    return int(re.search(rb'offset="(\d+)"', tag).group(1))


def test_ascii_counts_are_bounded_by_their_text(tmp_path):
    from vtkmodules import vtkIOXML

    mesh = surface_mesh()
    w = vtkIOXML.vtkXMLPolyDataWriter()
    w.SetInputData(mesh)
    w.SetFileName(str(tmp_path / "a.vtp"))
    w.SetDataModeToAscii()
    assert w.Write() == 1
    raw = (tmp_path / "a.vtp").read_bytes()
    assert check_before_vtk(tmp_path / "a.vtp", ["pMeanTrim"]) == (mesh.n_points, mesh.n_cells)
    big = tmp_path / "big.vtp"
    big.write_bytes(set_attr(raw, "NumberOfPoints", 10**7))  # fits _plausible, not the text
    with pytest.raises(CorruptVtkXml, match=r"big\.vtp: .*points: declares 30000000 values, "
                       r"but its text holds at most"):  # fmt: skip
        check_before_vtk(big, ["pMeanTrim"])


def test_vtk_output_is_compared_with_the_declared_counts(tmp_path):
    m = CellMesh(np.zeros((3, 3)), np.array([0, 3]), np.array([0, 1, 2]), {}, [])
    check_vtk_output(tmp_path / "x.vtp", m, (3, 1))
    with pytest.raises(CorruptVtkXml, match=r"x\.vtp: .*VTK returned 3 points and 1 cells, "
                       r"the XML declares 4 and 1"):  # fmt: skip
        check_vtk_output(tmp_path / "x.vtp", m, (4, 1))
