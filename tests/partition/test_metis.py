from __future__ import annotations

import numpy as np
import pymetis
import pytest
import pyvista as pv
import scipy.sparse as sp

from meshshard.partition import dual_graph, knn_graph, metis, partition


def _cut(g, assignment) -> int:
    r, c = g.nonzero()
    return int((assignment[r] != assignment[c]).sum() // 2)


@pytest.fixture(scope="module")
def cloud():
    return np.random.default_rng(0).random((4000, 3))


def test_metis_close_to_raw_pymetis_and_beats_sfc(cloud):
    g = knn_graph(cloud, 8)
    p = partition(cloud, 8, method="metis")  # builds the same kNN graph internally
    raw = pymetis.part_graph(
        8,
        adjacency=pymetis.CSRAdjacency(g.indptr, g.indices),
        options=pymetis.Options(ufactor=30, seed=0),
        recursive=False,
    )
    ours = _cut(g, p.assignment)
    assert ours <= 1.15 * _cut(g, np.asarray(raw.vertex_part))
    assert ours < _cut(g, partition(cloud, 8, method="morton").assignment)
    assert p.sizes.max() / p.sizes.mean() <= 1.031
    assert p.params["graph"] == "knn8"
    assert p == partition(cloud, 8, method="metis")  # deterministic


def test_metis_targets_weights_and_empty_parts(cloud):
    p = metis(cloud, 3, targets=[0.5, 0.25, 0.25])
    assert np.abs(p.sizes / 4000 - [0.5, 0.25, 0.25]).max() < 0.02
    e = metis(cloud, 4, targets=[0.5, 0.0, 0.5, 0.0])
    assert e.sizes[1] == 0 and e.sizes[3] == 0 and e.sizes.sum() == 4000
    w = np.where(cloud[:, 0] < 0.3, 5.0, 1.0)
    q = metis(cloud, 4, weights=w)
    loads = np.bincount(q.assignment, weights=w, minlength=4)
    assert loads.max() / loads.mean() < 1.05
    assert q.sizes.max() > 1.3 * q.sizes.min()


def test_metis_single_part_never_calls_pymetis(cloud, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("pymetis called for one part")

    monkeypatch.setattr(pymetis, "part_graph", boom)
    p = metis(cloud, 1)
    assert p.sizes.tolist() == [4000]
    t = metis(cloud, 3, targets=[0.0, 1.0, 0.0])  # one live part: no METIS either
    assert t.sizes.tolist() == [0, 4000, 0]


def test_metis_on_mesh_dual_graph():
    grid = pv.ImageData(dimensions=(9, 9, 9)).cast_to_unstructured_grid()
    g = dual_graph(grid)
    p = metis(None, 4, graph=g, contig=True)
    assert p.sizes.sum() == 512 and p.params["graph"] == "given"
    assert _cut(g, p.assignment) < _cut(g, np.arange(512) % 4)
    cells = partition(grid.cell_centers().points, 4, method="metis", graph=g)
    assert cells.sizes.sum() == 512


def test_metis_rejects_malformed_graphs_before_pymetis(cloud, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("pymetis must not see a malformed graph")

    monkeypatch.setattr(pymetis, "part_graph", boom)
    a = sp.random(4000, 4000, density=1e-3, format="csr", random_state=0)
    a.setdiag(0)
    a.eliminate_zeros()
    with pytest.raises(ValueError, match="not symmetric"):
        metis(cloud, 4, graph=a)
    s = sp.eye(4000, format="csr")
    with pytest.raises(ValueError, match="self loop"):
        metis(cloud, 4, graph=s)
    with pytest.raises(ValueError, match="3 vertices but there are 4000 points"):
        metis(cloud, 4, graph=sp.csr_matrix((3, 3)))
    with pytest.raises(ValueError, match="needs points or a graph"):
        metis(None, 2)


def test_metis_rows_inside_shards_follow_the_hilbert_curve(cloud):
    from meshshard.partition import hilbert_codes

    p = metis(cloud, 4, weights=np.ones(4000))
    codes = hilbert_codes(cloud)[p.order].astype(np.float64)
    for piece in p.split(codes):
        assert np.all(np.diff(piece) >= 0)
