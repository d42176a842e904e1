"""Coincident points merged before the dual graph: foamToVTK's boundary file (every patch with
its own copy of the points it shares) must give one connected surface, with the merge reported."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pyvista as pv
from scipy.sparse.csgraph import connected_components

from meshshard.cli import main
from meshshard.partition import Partition, dual_graph
from meshshard.partition.graph import mesh_connectivity
from meshshard.partition.quality import metrics
from meshshard.partition.weld import weld_points
from tests.io._polymesh import FOAM_DIR

BOUNDARY = FOAM_DIR / "boundary.vtp"


def _coordinate_graph(mesh):
    """Oracle: cells adjacent when an edge has the same two end *coordinates* (no ids)."""
    import scipy.sparse as sp

    pts = np.asarray(mesh.points)
    conn, off, _ = mesh_connectivity(mesh)
    by_edge: dict[frozenset, list[int]] = {}
    for c in range(off.size - 1):
        ids = conn[off[c] : off[c + 1]]
        for a, b in zip(ids, np.roll(ids, -1), strict=True):
            key = frozenset((tuple(pts[a]), tuple(pts[b])))
            by_edge.setdefault(key, []).append(c)
    pairs = [(a, b) for cs in by_edge.values() for a in cs for b in cs if a != b]
    r, c = np.array(pairs).T
    n = off.size - 1
    return sp.csr_matrix((np.ones(r.size), (r, c)), shape=(n, n))


def test_weld_merges_exactly_the_copies():
    mesh = pv.read(BOUNDARY)
    conn, off, _ = mesh_connectivity(mesh)
    w = weld_points(mesh.points, conn, off)
    distinct = np.unique(np.asarray(mesh.points), axis=0).shape[0]
    assert w.merged == mesh.n_points - distinct == 58
    # every point maps to a point with the same coordinates, the lowest such id
    np.testing.assert_array_equal(mesh.points[w.representative], mesh.points)
    assert (w.representative <= np.arange(mesh.n_points)).all()
    assert w.tolerance == pytest.approx(1e-6 * w.shortest_edge) and w.shortest_edge > 0
    before = connected_components(dual_graph(mesh), directed=False)[0]
    welded = dual_graph(cells=w.apply(conn), offsets=off, celltypes=mesh_connectivity(mesh)[2])
    assert before > 1 and connected_components(welded, directed=False)[0] == 1
    assert (welded != _coordinate_graph(mesh)).nnz == 0
    # the same from the library call
    assert (dual_graph(mesh, merge_tol=1e-6) != welded).nnz == 0
    with pytest.raises(ValueError, match="merge_tol= needs the mesh"):
        dual_graph(cells=conn, offsets=off, celltypes=mesh_connectivity(mesh)[2], merge_tol=1e-6)


def test_weld_tolerances():
    # tolerance 1e-6 x the shortest edge (1): 1 ~ 2 and 2 ~ 3 are within it, 1 ~ 3 is not
    pts = np.array([[0, 0, 0], [1, 0, 0], [1 + 7e-7, 0, 0], [1 + 14e-7, 0, 0], [0, 1, 0]])
    w = weld_points(pts, [0, 1, 4, 0, 2, 4, 0, 3, 4], [0, 3, 6, 9])
    assert w.apply([1, 2, 3]).tolist() == [1, 1, 1] and w.merged == 2  # the chain, whole
    assert weld_points(pts, [0, 1, 4], [0, 3], tolerance=0.0).merged == 0
    for bad in (0.0, -1.0, 0.5, float("nan")):
        with pytest.raises(ValueError, match="must be > 0 and < 0.5"):
            weld_points(pts, [0, 1, 4], [0, 3], relative=bad)
    with pytest.raises(ValueError, match="must be a finite distance >= 0"):
        weld_points(pts, [0, 1, 4], [0, 3], tolerance=-1.0)


def test_raw_foamtovtk_patch_file_partitions_into_connected_parts(tmp_path, capsys):
    out = tmp_path / "p"
    argv = ["partition", str(BOUNDARY), "-p", "4", "-m", "metis", "-o", str(out), "--json",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["merged_points"]["merged"] == 58 and rep["merged_points"]["distinct"] == 192
    assert rep["noncontiguous_parts"] == 0 and rep["edge_cut"] > 0
    want = metrics(Partition.load(out), graph=_coordinate_graph(pv.read(BOUNDARY)))
    assert rep["edge_cut"] == want["edge_cut"] and rep["num_edges"] == want["num_edges"]
    assert Partition.load(out).params["merge_tol"] == 1e-6
    # the text report says it in one line
    assert main([*argv[:-2], "--force", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "merged points: 58 coincident copies (250 -> 192 points; tolerance" in text
    # inspect of that directory merges the same way (the tolerance is recorded)
    assert main(["inspect", str(out), "--json", "--no-progress"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["edge_cut"] == rep["edge_cut"] and again["merged_points"]["merged"] == 58


def test_merge_off_warns_and_bad_tolerance_is_one_line(tmp_path, capfd):
    argv = ["partition", str(BOUNDARY), "-p", "4", "-o", str(tmp_path / "p"), "--no-progress"]
    assert main([*argv, "--merge-tol", "0", "--json"]) == 0
    rep = json.loads(capfd.readouterr().out)
    assert rep["coincident_points_not_merged"] == 58 and "merged_points" not in rep
    assert main([*argv, "--merge-tol", "0", "--force"]) == 0
    assert "WARNING: 58 points are copies of others and were not merged" in capfd.readouterr().out
    for bad in ("-1", "0.5"):
        assert main([*argv, "--merge-tol", bad, "--force"]) == 2
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--merge-tol {float(bad):g} must be >= 0 and < 0.5" in err[0]
