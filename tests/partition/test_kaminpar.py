from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from meshshard.partition import kaminpar_part as kp_mod
from meshshard.partition import knn_graph, metrics, partition

kaminpar = pytest.importorskip("kaminpar")


def _cut(g, assignment) -> int:
    r, c = g.nonzero()
    return int((assignment[r] != assignment[c]).sum() // 2)


@pytest.fixture(scope="module")
def cloud():
    return np.random.default_rng(0).random((4000, 3))


@pytest.fixture(scope="module")
def grid_graph():
    """Dual graph of a 30x30x10 voxel block (face neighbours), with an isolated vertex."""
    nx, ny, nz = 30, 30, 10
    idx = np.arange(nx * ny * nz).reshape(nx, ny, nz)
    pairs = [
        (idx[:-1].ravel(), idx[1:].ravel()),
        (idx[:, :-1].ravel(), idx[:, 1:].ravel()),
        (idx[:, :, :-1].ravel(), idx[:, :, 1:].ravel()),
    ]
    r = np.concatenate([a for a, _ in pairs])
    c = np.concatenate([b for _, b in pairs])
    n = idx.size + 1  # the last vertex has no neighbours (an empty METIS line)
    g = sp.coo_matrix((np.ones(r.size), (r, c)), shape=(n, n)).tocsr()
    return (g + g.T).tocsr()


@pytest.mark.parametrize("preset", ["default", "strong"])
@pytest.mark.parametrize("parts", [2, 3, 4])
def test_valid_balanced_partition_of_a_given_graph(grid_graph, preset, parts):
    n = grid_graph.shape[0]
    p = partition(None, parts, method="kaminpar", graph=grid_graph, preset=preset, epsilon=0.03)
    assert p.method == "kaminpar" and p.params["preset"] == preset
    assert p.sizes.sum() == n and p.assignment.shape == (n,)
    assert np.array_equal(np.bincount(p.assignment, minlength=parts), p.sizes)
    assert np.array_equal(np.sort(p.order), np.arange(n))
    assert p.sizes.max() <= np.ceil(1.03 * n / parts)
    # near the optimum: slabs across x (300 faces per cut); a random labelling cuts ~13k+
    slabs = np.minimum(np.arange(n) * parts // n, parts - 1)
    assert _cut(grid_graph, p.assignment) <= 1.5 * _cut(grid_graph, slabs)


def test_deterministic_with_a_seed_and_the_seed_matters(cloud):
    a = partition(cloud, 4, method="kaminpar", seed=3)
    b = partition(cloud, 4, method="kaminpar", seed=3)
    assert np.array_equal(a.assignment, b.assignment)
    assert a == b
    others = [partition(cloud, 4, method="kaminpar", seed=s).assignment for s in (4, 5, 6)]
    assert any(not np.array_equal(a.assignment, o) for o in others)


def test_knn_graph_cut_close_to_metis(cloud):
    g = knn_graph(cloud, 8)
    k = partition(cloud, 8, method="kaminpar", preset="strong")
    m = partition(cloud, 8, method="metis")
    assert _cut(g, k.assignment) <= 1.15 * _cut(g, m.assignment)
    assert k.params["graph"] == "knn8"
    assert k.sizes.max() <= np.ceil(1.03 * 4000 / 8)


def test_targets_weights_and_empty_parts(cloud):
    p = partition(cloud, 3, method="kaminpar", targets=[0.5, 0.25, 0.25])
    assert np.abs(p.sizes / 4000 - [0.5, 0.25, 0.25]).max() < 0.03
    e = partition(cloud, 4, method="kaminpar", targets=[0.5, 0.0, 0.5, 0.0])
    assert e.sizes[1] == 0 and e.sizes[3] == 0 and e.sizes.sum() == 4000
    w = np.where(cloud[:, 0] < 0.3, 5.0, 1.0)
    q = partition(cloud, 4, method="kaminpar", weights=w)
    loads = np.bincount(q.assignment, weights=w, minlength=4)
    assert loads.max() / loads.mean() < 1.05
    assert q.sizes.max() > 1.3 * q.sizes.min()
    z = np.where(cloud[:, 0] < 0.5, 0.0, 1.0)  # zero-weight vertices are legal
    r = partition(cloud, 4, method="kaminpar", weights=z)
    zl = np.bincount(r.assignment, weights=z, minlength=4)
    assert r.sizes.sum() == 4000 and zl.max() / zl.mean() < 1.05


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"preset": "turbo"}, "preset='turbo' is not one of"),
        ({"epsilon": 0.0}, "epsilon=0.0 must be a float in"),
        ({"epsilon": 1.5}, "epsilon=1.5 must be a float in"),
        ({"threads": 0}, "threads=0 must be an integer >= 1"),
        ({"seed": -1}, "seed=-1 must be an integer >= 0"),
        ({"seed": True}, "seed=True must be an integer"),
    ],
)
def test_bad_options_raise_clearly(cloud, kw, match):
    with pytest.raises(ValueError, match=match):
        partition(cloud, 2, method="kaminpar", **kw)


def test_asymmetric_graph_rejected_before_kaminpar():
    g = sp.csr_matrix(([1.0], ([0], [1])), shape=(3, 3))
    with pytest.raises(ValueError, match="symmetric"):
        partition(None, 2, method="kaminpar", graph=g)


def test_missing_package_names_the_extra(cloud, monkeypatch):
    monkeypatch.setattr(kp_mod, "WITH_KAMINPAR", False)
    with pytest.raises(ImportError, match=r"meshshard\[kaminpar\]"):
        partition(cloud, 2, method="kaminpar")


def test_kaminpar_refine_and_tries(cloud):
    g = knn_graph(cloud, 8)
    plain = partition(cloud, 4, method="kaminpar", graph=g, seed=3)
    best = partition(cloud, 4, method="kaminpar", graph=g, refine="volume", tries=2, seed=3)
    vol = metrics(best, graph=g)["comm_volume"]
    tv, before = best.params["try_volumes"], best.params["try_volumes_unrefined"]
    assert best.params["try_seeds"] == [3, 4] and vol == min(tv)
    assert before[0] == metrics(plain, graph=g)["comm_volume"]
    assert all(x <= y for x, y in zip(tv, before)) and tv != before
    assert best.sizes.max() <= np.floor(1.03 * len(cloud) / 4)
    with pytest.raises(ValueError, match="tries=0"):
        partition(cloud, 4, method="kaminpar", graph=g, tries=0)


@pytest.mark.parametrize("weighted", [False, True])
def test_parhip_file_holds_the_graph_and_weights(grid_graph, tmp_path, weighted):
    """The binary file KaMinPar reads back is the graph itself: every neighbour list, every
    vertex weight (and the isolated vertex), no text formatting in between."""
    g = grid_graph.tocsr()
    n = g.shape[0]
    vw = np.arange(n, dtype=np.int64) % 7 + 1 if weighted else None
    path = str(tmp_path / "g.parhip")
    kp_mod._write_parhip(path, g, vw)
    kg = kaminpar.load_graph(path, kaminpar.GraphFileFormat.PARHIP)
    assert kg.n() == n and kg.m() == g.nnz
    for v in (0, 1, 457, n - 2, n - 1):
        got = sorted(u for u, _ in kg.neighbors(v))
        assert got == sorted(g.indices[g.indptr[v] : g.indptr[v + 1]].tolist())
        assert kg.node_weight(v) == (1 if vw is None else vw[v])
    labels = np.arange(n) % 3
    assert kaminpar.edge_cut(kg, labels.tolist()) == _cut(g, labels)
