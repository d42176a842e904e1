"""Polyhedra (VTK type 42): their faces read from both of VTK's layouts, the dual graph against
brute-force face matching, volumes and centroids against exact values and VTK's own."""

from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.io.cells import PolyhedronFaces
from meshshard.io.cellsizes import cell_volumes
from meshshard.io.vtkxml import CorruptVtkXml, VtkXmlFile
from meshshard.partition import dual_graph, partition
from meshshard.partition.cutcount import dual_cut_metrics
from meshshard.partition.graph import mesh_connectivity, mesh_polyhedra
from meshshard.partition.io import cell_centers
from meshshard.partition.quality import metrics
from tests.io._polymesh import (
    FOAM_DIR,
    brute_force_pairs,
    legacy_arrays,
    legacy_vtu,
    poly_mesh,
)

FOAM = FOAM_DIR / "internal.vtu"


def _edges(adj) -> set[tuple[int, int]]:
    coo = adj.tocoo()
    return set(zip(coo.row.tolist(), coo.col.tolist(), strict=True))


def _faces_of(poly: PolyhedronFaces, cell: int) -> list[tuple[int, ...]]:
    fo, fc = poly.face_offsets, poly.face_connectivity
    ids = poly.cell_faces[poly.cell_offsets[cell] : poly.cell_offsets[cell + 1]]
    return [tuple(fc[fo[f] : fo[f + 1]].tolist()) for f in ids]


def _vtk_faces(grid) -> list[list[tuple[int, ...]]]:
    """Every cell's faces as VTK lists them (an oracle independent of meshshard's tables)."""
    return [[tuple(f.point_ids) for f in grid.get_cell(i).faces] for i in range(grid.n_cells)]


@pytest.mark.parametrize("seed", [0, 1])
def test_dual_graph_matches_brute_force_face_matching(seed):
    m = poly_mesh(seed=seed)
    want = brute_force_pairs(m.faces)
    assert _edges(dual_graph(m.grid)) == want
    # the same from flat arrays and the faces record (the API without a mesh)
    conn, off, types = mesh_connectivity(m.grid)
    adj = dual_graph(cells=conn, offsets=off, celltypes=types, polyhedra=mesh_polyhedra(m.grid))
    assert _edges(adj) == want
    assert {"merged", "poly_in", "poly_mixed", "hex"} <= set(m.kinds)


def test_dual_graph_of_an_openfoam_export_matches_vtk_faces():
    grid = pv.read(FOAM)
    assert int((grid.celltypes == 42).sum()) == 18
    poly = mesh_polyhedra(grid)
    assert poly.widest_face() > 4  # split faces with hanging points
    want = brute_force_pairs(_vtk_faces(grid))
    got = _edges(dual_graph(grid))
    assert got == want and len(got) == 2 * 454  # OpenFOAM's checkMesh: 454 internal faces


def test_polyhedra_without_faces_are_refused():
    m = poly_mesh()
    conn, off, types = mesh_connectivity(m.grid)
    with pytest.raises(ValueError, match="polyhedral cell.*no faces"):
        dual_graph(cells=conn, offsets=off, celltypes=types)
    with pytest.raises(ValueError, match="polyhedra= goes with cells="):
        dual_graph(m.grid, polyhedra=mesh_polyhedra(m.grid))


@pytest.mark.parametrize("seed", [0, 1])
def test_volumes_and_centroids_exact_and_as_vtk(seed):
    m = poly_mesh(seed=seed)
    conn, off, types = mesh_connectivity(m.grid)
    s = cell_volumes(m.grid.points, conn, off, types, mesh_polyhedra(m.grid))
    # rounding floor: a few ulps of the coordinates (|x| ~ 10)
    np.testing.assert_allclose(s.volumes, m.volumes, rtol=1e-13)
    np.testing.assert_allclose(s.centroids, m.centroids, rtol=0, atol=1e-13)
    vtk = m.grid.compute_cell_sizes(length=False, area=False).cell_data["Volume"]
    np.testing.assert_allclose(s.volumes, vtk, rtol=1e-12)
    assert s.reoriented == m.kinds.count("poly_mixed")  # faces flipped one by one


def test_volumes_of_an_openfoam_export():
    grid = pv.read(FOAM)
    conn, off, types = mesh_connectivity(grid)
    s = cell_volumes(grid.points, conn, off, types, mesh_polyhedra(grid))
    assert s.reoriented == 0  # OpenFOAM writes every cell's faces outward
    # the box is 0.1 x 0.1 x 0.08; float32 points
    assert s.volumes.sum() == pytest.approx(0.1 * 0.1 * 0.08, rel=1e-6)
    vtk = grid.compute_cell_sizes(length=False, area=False).cell_data["Volume"]
    np.testing.assert_allclose(s.volumes, vtk, rtol=1e-5)
    # every cell is geometrically a box (hanging points lie on its edges and faces): its
    # centroid is the centre of its points' bounding box
    p = np.asarray(grid.points, dtype=np.float64)
    lo = np.array([p[conn[a:b]].min(0) for a, b in zip(off[:-1], off[1:], strict=True)])
    hi = np.array([p[conn[a:b]].max(0) for a, b in zip(off[:-1], off[1:], strict=True)])
    np.testing.assert_allclose(s.centroids, (lo + hi) / 2, atol=1e-8)


def test_cell_volumes_refuses_surfaces():
    with pytest.raises(ValueError, match="3-D cells"):
        cell_volumes(np.eye(3), [0, 1, 2], [0, 3], [5])


def _same_faces(a: PolyhedronFaces, b: PolyhedronFaces) -> None:
    assert a.n_cells == b.n_cells
    np.testing.assert_array_equal(a.polyhedra(), b.polyhedra())
    for c in a.polyhedra().tolist():
        assert _faces_of(a, c) == _faces_of(b, c)


def test_reader_decodes_both_layouts(tmp_path):
    m = poly_mesh()
    new = tmp_path / "new.vtu"
    m.grid.save(new)  # pyvista/VTK 9.4+: face_connectivity, face_offsets, polyhedron_*
    legacy = tmp_path / "legacy.vtu"
    legacy_vtu(legacy, *legacy_arrays(m))  # faces/faceoffsets, as foamToVTK writes
    for path in (new, legacy, FOAM):
        with VtkXmlFile(path) as f:
            got, types = f.polyhedra(), f.types()
        grid = pv.read(path)
        np.testing.assert_array_equal(types, grid.celltypes)
        _same_faces(got, PolyhedronFaces.from_vtk(grid))
    with VtkXmlFile(FOAM_DIR / "boundary.vtp") as f:
        assert f.polyhedra() is None and f.types() is None


def _damaged(tmp_path, what: str):
    pts, conn, ends, types, stream, foff = legacy_arrays(poly_mesh())
    stream, foff = list(stream), list(foff)
    if what == "point":
        stream[2] = 10**6
    elif what == "count":
        stream[0] = 10**9  # VTK 9.7 dies of SIGSEGV on this one
    elif what == "offset":
        foff[-1] = 10**7
    elif what == "order":
        i = [j for j, v in enumerate(foff) if v >= 0]
        foff[i[0]], foff[i[1]] = foff[i[1]], foff[i[0]]
    path = tmp_path / f"{what}.vtu"
    legacy_vtu(path, pts, conn, ends, types, stream, foff)
    if what == "missing":
        import re

        text = re.sub(r'<DataArray type="Int64" Name="face.*?</DataArray>\n', "",
                      path.read_text(), flags=re.S)  # fmt: skip
        path.write_text(text)
    return path


DAMAGE = {
    "point": "refers to point 1000000",
    "count": "shorter than its face counts",
    "offset": "end within the faces stream",
    "order": "must increase",
    "missing": "no faces/faceoffsets",
}


@pytest.mark.parametrize("what", sorted(DAMAGE))
def test_damaged_polyhedron_faces_name_the_file(tmp_path, what):
    path = _damaged(tmp_path, what)
    with pytest.raises(CorruptVtkXml, match=DAMAGE[what]) as err, VtkXmlFile(path) as f:
        f.polyhedra()
    assert str(path) in str(err.value)


def test_legacy_stream_parser():
    quads = [[0, 3, 2, 1], [4, 5, 6, 7], [0, 1, 5, 4], [1, 2, 6, 5], [2, 3, 7, 6], [3, 0, 4, 7]]
    one = [6] + [x for q in quads for x in [4, *q]]
    pf = PolyhedronFaces.from_legacy(one + one, [-1, len(one), -1, 2 * len(one)])
    assert pf.polyhedra().tolist() == [1, 3] and pf.n_faces == 12
    assert _faces_of(pf, 3) == [tuple(q) for q in quads]
    pf.check(8, np.array([10, 42, 12, 42]))
    with pytest.raises(ValueError, match="needs >= 4"):
        pf.check(8, np.array([10, 42, 12, 12]) * 0 + 42)  # cell 0 has no faces
    with pytest.raises(ValueError, match="longer than its face counts"):
        PolyhedronFaces.from_legacy([*one, 9], [len(one) + 1])
    sub = pf.subset(np.array([3, 0]))
    assert sub.polyhedra().tolist() == [0] and _faces_of(sub, 0) == [tuple(q) for q in quads]


def test_cut_metrics_of_polyhedra_equal_the_full_graph():
    grid = pv.read(FOAM)
    part = partition(cell_centers(grid), 3, method="hilbert")
    full = metrics(part, graph=dual_graph(grid))
    cut = dual_cut_metrics(grid, part)
    for key in ("edge_cut", "comm_volume", "halo_sizes", "neighbours"):
        assert cut[key] == full[key], key
    assert cut["edge_cut"] > 0
