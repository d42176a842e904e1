"""`partition` and `inspect` on meshes with polyhedra (VTK type 42): a real OpenFOAM export
(foamToVTK's legacy faces layout) and a generated mesh in VTK 9.4's layout. The edge cut is
checked against the dual graph made by brute-force face matching, not by meshshard."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pyvista as pv
import scipy.sparse as sp

from meshshard.cli import main
from meshshard.partition import Partition
from meshshard.partition.quality import metrics
from tests.io._polymesh import FOAM_DIR, brute_force_pairs, legacy_arrays, legacy_vtu, poly_mesh

FOAM = FOAM_DIR / "internal.vtu"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("poly")
    m = poly_mesh()
    m.grid.save(d / "generated.vtu")
    faces = {"generated.vtu": m.faces}
    grid = pv.read(FOAM)
    faces["foam.vtu"] = [[tuple(f.point_ids) for f in grid.get_cell(i).faces]
                         for i in range(grid.n_cells)]  # fmt: skip
    (d / "foam.vtu").write_bytes(FOAM.read_bytes())
    pts, conn, ends, types, stream, foff = legacy_arrays(m)
    stream = list(stream)
    stream[0] = 10**9  # a face count VTK 9.7 dies on (SIGSEGV)
    legacy_vtu(d / "damaged.vtu", pts, conn, ends, types, stream, foff)
    return d, faces


def _oracle_graph(faces) -> sp.csr_matrix:
    pairs = np.array(sorted(brute_force_pairs(faces)))
    n = len(faces)
    return sp.csr_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))


@pytest.mark.parametrize("name", ["foam.vtu", "generated.vtu"])
@pytest.mark.parametrize("method", ["metis", "hilbert"])
def test_partition_polyhedra(files, tmp_path, capsys, name, method):
    d, faces = files
    out = tmp_path / "p"
    argv = ["partition", str(d / name), "-p", "3", "-m", method, "-o", str(out), "--json",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    part = Partition.load(out)
    want = metrics(part, graph=_oracle_graph(faces[name]))
    assert rep["edge_cut"] == want["edge_cut"] > 0
    assert rep["comm_volume"] == want["comm_volume"]
    assert rep["num_edges"] == want["num_edges"]
    # --metrics cut (cells along the cuts only) counts the same faces
    argv = ["partition", str(d / name), "-p", "3", "-m", "hilbert", "-o", str(tmp_path / "c"),
            "--json", "--metrics", "cut", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    want = metrics(Partition.load(tmp_path / "c"), graph=_oracle_graph(faces[name]))
    assert rep["edge_cut"] == want["edge_cut"]


def test_inspect_polyhedra(files, capsys):
    d, _ = files
    assert main(["inspect", str(d / "foam.vtu"), "-p", "4", "-m", "metis", "--json",
                 "--no-progress"]) == 0  # fmt: skip
    rep = json.loads(capsys.readouterr().out)
    assert rep["parts"] == 4 and rep["edge_cut"] > 0 and rep["empty_parts"] == 0


def test_damaged_polyhedra_are_one_line_exit_2(files, tmp_path, capfd):
    d, _ = files
    for cmd in (["partition", str(d / "damaged.vtu"), "-p", "2", "-o", str(tmp_path / "x")],
                ["inspect", str(d / "damaged.vtu"), "-p", "2"]):  # fmt: skip
        assert main([*cmd, "--no-progress"]) == 2
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert "damaged.vtu: truncated or corrupt VTK XML file (polyhedron faces:" in err[0]
