"""meshshard's VTK XML reader against VTK's own, on every layout VTK's writers produce."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import pyvista as pv

from meshshard.io import vtkxml
from meshshard.io.geometry import vtk_cells
from meshshard.io.vtkxml import CorruptVtkXml, UnsupportedVtkXml, read_cells
from tests.pipelines._damage import write_vtk


def _surface() -> pv.PolyData:
    """Quads and triangles mixed, fields of several types and widths."""
    quads = pv.Plane(i_resolution=23, j_resolution=17).triangulate()
    mesh = pv.Sphere(theta_resolution=31, phi_resolution=19).merge(
        pv.Plane(i_resolution=23, j_resolution=17, center=(3, 0, 0))
    )
    del quads
    mesh = pv.PolyData(mesh.points, mesh.faces)
    rng = np.random.default_rng(0)
    mesh.cell_data["pMeanTrim"] = rng.normal(size=mesh.n_cells).astype(np.float32)
    mesh.cell_data["wss"] = rng.normal(size=(mesh.n_cells, 3)).astype(np.float64)
    mesh.cell_data["label"] = np.arange(mesh.n_cells, dtype=np.int32)
    mesh.point_data["ignored"] = rng.normal(size=mesh.n_points)
    return mesh


def _volume() -> pv.UnstructuredGrid:
    grid = pv.ImageData(dimensions=(7, 6, 5)).cast_to_unstructured_grid()
    tets = grid.triangulate()
    # hexahedra and tetrahedra interleaved: cells of different sizes
    mixed = grid.merge(tets.translate((10, 0, 0)), merge_points=False)
    rng = np.random.default_rng(1)
    mixed.cell_data["UMeanTrim"] = rng.normal(size=(mixed.n_cells, 3)).astype(np.float32)
    mixed.cell_data["pMeanTrim"] = rng.normal(size=mixed.n_cells).astype(np.float32)
    return mixed


def _write(mesh, path, mode, compressor, header, ids, order, block=None):
    return write_vtk(mesh, path, mode, compressor, header, ids, block, order)


def _assert_same(path, names, polys):
    got = read_cells(path, names)
    ref = pv.read(path)
    off, conn = vtk_cells(ref.GetPolys() if polys else ref.GetCells())
    np.testing.assert_array_equal(got.offsets, off)
    np.testing.assert_array_equal(got.connectivity, conn)
    np.testing.assert_array_equal(got.points, np.asarray(ref.points))
    assert got.points.dtype == np.asarray(ref.points).dtype
    for name in names:
        if name in ref.cell_data:
            want = np.asarray(ref.cell_data[name])
            np.testing.assert_array_equal(got.cell_data[name], want)
            assert got.cell_data[name].dtype == want.dtype
        else:
            assert name not in got.cell_data
    assert got.cell_array_names == list(ref.cell_data.keys())
    assert got.n_cells == ref.n_cells
    return got


MODES = ["binary", "appended-raw", "appended-base64"]
LAYOUTS = list(
    itertools.product(MODES, ["None", "ZLib", "LZ4", "LZMA"], ["UInt32", "UInt64"],
                      ["Int32", "Int64"])
)


@pytest.mark.parametrize(("mode", "compressor", "header", "ids"), LAYOUTS)
def test_surface_layouts_match_vtk(tmp_path, mode, compressor, header, ids):
    path = _write(_surface(), tmp_path / "s.vtp", mode, compressor, header, ids, "LittleEndian")
    _assert_same(path, ["pMeanTrim", "wss", "label", "absent"], polys=True)


@pytest.mark.parametrize(
    ("mode", "compressor"), list(itertools.product(MODES, ["None", "ZLib", "LZ4"]))
)
@pytest.mark.parametrize("order", ["LittleEndian", "BigEndian"])
def test_volume_layouts_match_vtk(tmp_path, mode, compressor, order):
    path = _write(_volume(), tmp_path / "v.vtu", mode, compressor, "UInt64", "Int64", order)
    got = _assert_same(path, ["UMeanTrim", "pMeanTrim"], polys=False)
    assert got.points.dtype.isnative and got.connectivity.dtype.isnative


@pytest.mark.parametrize("mode", MODES)
def test_many_small_blocks_and_pieces_of_base64(tmp_path, monkeypatch, mode):
    """Blocks queued while their base64 is still being decoded, in many small tasks."""
    monkeypatch.setattr(vtkxml, "_B64_CHARS", 4 * 37)
    monkeypatch.setattr(vtkxml, "_TASK_BYTES", 700)
    path = _write(_surface(), tmp_path / "s.vtp", mode, "ZLib", "UInt32", "Int64", "LittleEndian",
                  block=256)
    _assert_same(path, ["pMeanTrim", "wss"], polys=True)


def test_single_thread_equals_threads(tmp_path):
    path = _write(_surface(), tmp_path / "s.vtp", "binary", "ZLib", "UInt32", "Int64",
                  "LittleEndian", block=512)
    a = read_cells(path, ["wss"], threads=1)
    b = read_cells(path, ["wss"], threads=4)
    np.testing.assert_array_equal(a.cell_data["wss"], b.cell_data["wss"])
    np.testing.assert_array_equal(a.connectivity, b.connectivity)


def test_non_polygon_cells_are_counted(tmp_path):
    mesh = _surface()
    lines = pv.Line((0, 0, 5), (1, 1, 5), resolution=4)
    both = mesh.merge(lines, merge_points=False)
    both.cell_data["pMeanTrim"] = np.zeros(both.n_cells, np.float32)
    path = _write(both, tmp_path / "s.vtp", "appended-raw", "None", "UInt32", "Int64",
                  "LittleEndian")
    got = read_cells(path, ["pMeanTrim"])
    assert got.n_other_cells == lines.n_cells
    assert got.offsets.size - 1 == mesh.n_cells
    assert got.cell_data["pMeanTrim"].shape == (both.n_cells,)


@pytest.mark.parametrize(
    ("mode", "compressor"), [("ascii", "None")]
)
def test_layouts_left_to_vtk(tmp_path, mode, compressor):
    path = _write(_surface(), tmp_path / "s.vtp", mode, compressor, "UInt32", "Int64",
                  "LittleEndian")
    with pytest.raises(UnsupportedVtkXml):
        read_cells(path, ["pMeanTrim"])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compressor", ["None", "ZLib", "LZ4"])
def test_truncated_files_are_refused_not_misread(tmp_path, mode, compressor):
    path = _write(_surface(), tmp_path / "s.vtp", mode, compressor, "UInt32", "Int64",
                  "LittleEndian", block=1024)
    raw = path.read_bytes()
    for frac in (0.05, 0.3, 0.5, 0.8, 0.97, 0.999):
        cut = tmp_path / f"cut{frac}.vtp"
        cut.write_bytes(raw[: int(len(raw) * frac)])
        with pytest.raises(CorruptVtkXml):
            read_cells(cut, ["pMeanTrim", "wss"])


def test_damaged_compressed_block_is_refused(tmp_path):
    path = _write(_surface(), tmp_path / "s.vtp", "appended-raw", "ZLib", "UInt32", "Int64",
                  "LittleEndian", block=1024)
    raw = bytearray(path.read_bytes())
    at = len(raw) - 3000  # inside the last arrays' compressed data
    raw[at : at + 40] = bytes(40)
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptVtkXml):
        read_cells(path, ["pMeanTrim", "wss"])


def test_not_a_vtk_file(tmp_path):
    for text in (b"", b"\x00\xffnot vtk" * 100, b"<?xml version='1.0'?><Other/>"):
        p = tmp_path / "x.vtp"
        p.write_bytes(text)
        with pytest.raises(CorruptVtkXml):
            read_cells(p, [])


def test_out_of_range_vertex_ids_are_refused(tmp_path):
    mesh = pv.PolyData(np.eye(3, dtype=np.float32), faces=[3, 0, 1, 2])
    path = _write(mesh, tmp_path / "s.vtp", "appended-raw", "None", "UInt32", "Int64",
                  "LittleEndian")
    raw = bytearray(path.read_bytes())
    conn = np.array([0, 1, 2], dtype="<i8").tobytes()
    at = raw.rfind(conn)
    raw[at : at + 24] = np.array([0, 1, 7], dtype="<i8").tobytes()
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptVtkXml, match="refers to point 7, but the file has 3 points"):
        read_cells(path, [])


def test_damaged_block_header_does_not_allocate_its_claim(tmp_path):
    """A connectivity header claiming a huge size is refused before any buffer is made."""
    import mmap

    path = _write(_surface(), tmp_path / "s.vtp", "appended-raw", "ZLib", "UInt32", "Int64",
                  "LittleEndian", block=1024)
    with open(path, "rb") as fh:
        layout = vtkxml._scan(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
    conn = next(a for a in layout.arrays if a.attrs.get("Name") == "connectivity"
                and a.path[-1] == "Polys")
    at = layout.appended[1] + int(conn.attrs["offset"])
    raw = bytearray(path.read_bytes())
    raw[at + 4 : at + 8] = np.array([2**31 - 1], "<u4").tobytes()  # block size
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptVtkXml, match="connectivity: .* bytes, expected"):
        read_cells(path, [])


def test_threads_from_the_environment(monkeypatch, tmp_path):
    """Preprocessing workers share the CPUs through MESHSHARD_READ_THREADS."""
    from meshshard.pipelines import _alloc
    from meshshard.pipelines.preprocess import _init_worker

    monkeypatch.setattr(_alloc, "tune_allocator", lambda: True)  # process-wide: not in pytest
    monkeypatch.setenv(vtkxml.THREADS_ENV, "3")
    assert vtkxml.default_threads() == 3
    monkeypatch.setenv(vtkxml.THREADS_ENV, "many")
    with pytest.raises(ValueError, match="MESHSHARD_READ_THREADS='many' must be an integer"):
        vtkxml.default_threads()
    monkeypatch.delenv(vtkxml.THREADS_ENV)
    assert 1 <= vtkxml.default_threads() <= 8
    _init_worker(2)
    assert vtkxml.default_threads() == 2  # (monkeypatch restores the variable's absence)


@pytest.mark.parametrize("mode", MODES)
def test_polyhedra_are_read_by_their_point_lists(tmp_path, mode):
    """A polyhedron (face stream in the file) next to a tetrahedron: the cells' point lists
    equal VTK's, so their vertex-mean centres do too."""
    pts = np.array(
        [[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1], [1, 1, 1], [0, 1, 1],
         [2, 0, 0]], dtype=np.float64,
    )  # fmt: skip
    faces = [[0, 3, 2, 1], [4, 5, 6, 7], [0, 1, 5, 4], [1, 2, 6, 5], [2, 3, 7, 6], [3, 0, 4, 7]]
    stream = [len(faces)] + [v for f in faces for v in (len(f), *f)]
    cells = np.array([len(stream), *stream, 4, 1, 8, 2, 5])
    grid = pv.UnstructuredGrid(cells, [pv.CellType.POLYHEDRON, pv.CellType.TETRA], pts)
    grid.cell_data["pMeanTrim"] = np.array([1.0, 2.0], np.float32)
    path = _write(grid, tmp_path / "v.vtu", mode, "ZLib", "UInt32", "Int64", "LittleEndian")
    got = _assert_same(path, ["pMeanTrim"], polys=False)
    assert got.offsets.tolist() == [0, 8, 12]
