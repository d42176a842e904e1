from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from meshshard.partition import hypergraph as hg_mod
from meshshard.partition import knn_graph, metrics, partition
from meshshard.partition.halo import ghost_rows
from meshshard.partition.hypergraph import nets_of

pytest.importorskip("mtkahypar")


def _grid(nx: int, ny: int, nz: int):
    idx = np.arange(nx * ny * nz).reshape(nx, ny, nz)
    pairs = [
        (idx[:-1].ravel(), idx[1:].ravel()),
        (idx[:, :-1].ravel(), idx[:, 1:].ravel()),
        (idx[:, :, :-1].ravel(), idx[:, :, 1:].ravel()),
    ]
    r = np.concatenate([a for a, _ in pairs])
    c = np.concatenate([b for _, b in pairs])
    g = sp.coo_matrix((np.ones(r.size), (r, c)), shape=(idx.size, idx.size)).tocsr()
    return (g + g.T).tocsr()


@pytest.fixture(scope="module")
def cloud():
    pts = np.random.default_rng(0).random((4000, 3))
    return pts, knn_graph(pts, 8)


def test_nets_are_the_k_ring_balls():
    g = _grid(4, 3, 2)
    n = g.shape[0]
    dense = (g.toarray() != 0).astype(int) + np.eye(n, dtype=int)
    for rings in (1, 2, 3):
        ptr, pins = nets_of(g, rings)
        reach = np.linalg.matrix_power(dense, rings) > 0
        for v in range(n):
            assert pins[ptr[v] : ptr[v + 1]].tolist() == np.flatnonzero(reach[v]).tolist()


@pytest.mark.parametrize("preset", ["deterministic", "deterministic_quality",
                                    "deterministic_quality_fast", "default", "quality"])
@pytest.mark.parametrize("parts", [2, 3, 4])
def test_valid_balanced_partition_of_a_given_graph(preset, parts):
    g = _grid(20, 20, 8)
    n = g.shape[0]
    det = preset.startswith("deterministic")
    p = partition(None, parts, method="hypergraph", graph=g, preset=preset, epsilon=0.03,
                  deterministic=det)  # fmt: skip
    assert p.params["reproducible"] is det
    assert p.method == "hypergraph" and p.params["preset"] == preset
    assert np.array_equal(np.bincount(p.assignment, minlength=parts), p.sizes)
    assert np.array_equal(np.sort(p.order), np.arange(n))
    assert p.sizes.max() <= np.floor(1.03 * np.ceil(n / parts))
    # near the optimum: slabs across x (2 * 160 ghost rows per cut); random: thousands
    slabs = np.minimum(np.arange(n) * parts // n, parts - 1)
    slab_rows = metrics(type(p).from_assignment(slabs, parts), graph=g)["comm_volume"]
    assert metrics(p, graph=g)["comm_volume"] <= 1.5 * slab_rows


def test_fewer_ghost_rows_than_metis_vol_on_a_cloud(cloud):
    pts, g = cloud
    vol = metrics(partition(pts, 8, method="metis", graph=g, objective="vol"), graph=g)
    hyp = metrics(partition(pts, 8, method="hypergraph", graph=g), graph=g)
    assert hyp["comm_volume"] <= vol["comm_volume"]
    assert hyp["imbalance"] <= 1.03 + 1e-9


def test_rings_two_optimises_the_two_ring_ghosts(cloud):
    pts, g = cloud
    one = partition(pts, 8, method="hypergraph", graph=g, rings=1)
    two = partition(pts, 8, method="hypergraph", graph=g, rings=2)
    assert two.params["rings"] == 2
    assert ghost_rows(two, g, 2)[1] <= 1.02 * ghost_rows(one, g, 2)[1]


@pytest.mark.parametrize(
    "kw", [{}, {"preset": "deterministic_quality"}, {"preset": "deterministic_quality_fast"},
           {"init": "metis", "vcycles": 1}]
)
def test_deterministic_with_a_seed_and_the_seed_matters(cloud, kw):
    pts, g = cloud
    a = partition(pts, 4, method="hypergraph", graph=g, seed=3, **kw)
    b = partition(pts, 4, method="hypergraph", graph=g, seed=3, **kw)
    assert a == b
    others = [partition(pts, 4, method="hypergraph", graph=g, seed=s, **kw) for s in (4, 5)]
    assert any(not np.array_equal(a.assignment, o.assignment) for o in others)


def test_run_to_run_presets_need_opting_in(cloud):
    with pytest.raises(ValueError, match="pass deterministic=False"):
        partition(cloud[0], 2, method="hypergraph", preset="quality")


def test_targets_weights_and_empty_parts(cloud):
    pts, g = cloud
    n = len(pts)
    p = partition(pts, 3, method="hypergraph", graph=g, targets=[0.5, 0.25, 0.25])
    assert np.all(p.sizes <= np.floor(1.03 * np.array([0.5, 0.25, 0.25]) * n))
    e = partition(pts, 4, method="hypergraph", graph=g, targets=[0.5, 0.0, 0.5, 0.0])
    assert e.sizes[1] == 0 and e.sizes[3] == 0 and e.sizes.sum() == n
    w = np.where(pts[:, 0] < 0.3, 5.0, 1.0)
    q = partition(pts, 4, method="hypergraph", graph=g, weights=w)
    loads = np.bincount(q.assignment, weights=w, minlength=4)
    assert loads.max() <= 1.03 * w.sum() / 4 + 5.0
    assert q.sizes.max() > 1.3 * q.sizes.min()
    wt = partition(pts, 2, method="hypergraph", graph=g, weights=w, targets=[0.7, 0.3])
    lt = np.bincount(wt.assignment, weights=w, minlength=2)
    assert np.all(lt <= 1.03 * np.array([0.7, 0.3]) * w.sum() + 5.0)
    z = np.where(pts[:, 0] < 0.5, 0.0, 1.0)  # zero-weight vertices are legal
    r = partition(pts, 4, method="hypergraph", graph=g, weights=z)
    zl = np.bincount(r.assignment, weights=z, minlength=4)
    assert r.sizes.sum() == n and zl.max() <= 1.03 * z.sum() / 4 + 1


def test_metis_start_and_vcycles_never_lose(cloud):
    pts, g = cloud
    start = metrics(partition(pts, 8, method="metis", graph=g, objective="vol"), graph=g)
    p = partition(pts, 8, method="hypergraph", graph=g, init="metis", vcycles=1)
    m = metrics(p, graph=g)
    assert m["comm_volume"] <= start["comm_volume"] and m["imbalance"] <= 1.03 + 1e-9
    assert p.params["init"] == "metis" and p.params["vcycles"] == 1


def test_refine_and_tries_record_each_try(cloud):
    pts, g = cloud
    best = partition(pts, 4, method="hypergraph", graph=g, refine="volume", tries=2, seed=3)
    tv, before = best.params["try_volumes"], best.params["try_volumes_unrefined"]
    assert best.params["try_seeds"] == [3, 4]
    assert metrics(best, graph=g)["comm_volume"] == min(tv)
    assert all(x <= y for x, y in zip(tv, before))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"preset": "turbo"}, "preset='turbo' is not one of"),
        ({"epsilon": 0.0}, "epsilon=0.0 must be a float in"),
        ({"threads": 0}, "threads=0 must be an integer >= 1"),
        ({"seed": -1}, "seed=-1 must be an integer >= 0"),
        ({"rings": 0}, "rings=0 must be an integer >= 1"),
        ({"vcycles": -1}, "vcycles=-1 must be an integer >= 0"),
        ({"init": "kaminpar"}, "init='kaminpar' is not one of"),
        ({"tries": 0}, "tries=0"),
        ({"rings": 2, "refine": "volume"}, "lowers the 1-ring volume only"),
    ],
)
def test_bad_options_raise_clearly(cloud, kw, match):
    with pytest.raises(ValueError, match=match):
        partition(cloud[0], 2, method="hypergraph", **kw)


def test_other_thread_count_refused_after_start(cloud):
    partition(cloud[0][:500], 2, method="hypergraph")
    with pytest.raises(ValueError, match="already started with threads=1"):
        partition(cloud[0][:500], 2, method="hypergraph", threads=2)


def test_asymmetric_graph_rejected_before_mtkahypar():
    g = sp.csr_matrix(([1.0], ([0], [1])), shape=(3, 3))
    with pytest.raises(ValueError, match="symmetric"):
        partition(None, 2, method="hypergraph", graph=g)


def test_missing_package_names_the_extra(cloud, monkeypatch):
    monkeypatch.setattr(hg_mod, "WITH_MTKAHYPAR", False)
    with pytest.raises(ImportError, match=r"meshshard\[hypergraph\]"):
        partition(cloud[0], 2, method="hypergraph")


def test_the_fast_quality_parameter_set_is_what_mtkahypar_runs(capfd):
    """``deterministic_quality_fast`` reaches Mt-KaHyPar as written (a key left out of the
    file would take the command line's default silently): its context reports the set's
    values, and the algorithms of ``deterministic_quality``."""
    from meshshard.partition.mtk_presets import context_from_config

    ctx = context_from_config(hg_mod._initializer(1), "deterministic_quality_fast")
    ctx.set_partitioning_parameters(4, 0.03, hg_mod.require_mtkahypar().Objective.KM1)
    capfd.readouterr()
    ctx.print_configuration()
    text = " ".join(capfd.readouterr().out.split())
    for line in ("Preset: deterministic_quality", "Number of Runs: 5", "Flow Scaling: 4",
                 "Maximum BFS Distance: 1", "Contraction Limit Multiplier: 80",
                 "Iterations without Improvement: 6",
                 "Algorithm: deterministic_multilevel_coarsener"):  # fmt: skip
        assert line in text, line
    assert text.count("Algorithm: deterministic") >= 4  # coarsening, Jet, flows, rebalancing


def test_a_parameter_set_mtkahypar_refuses_says_what_to_use(monkeypatch, cloud):
    from meshshard.partition import mtk_presets

    bad = {**mtk_presets.CONFIGS["deterministic_quality_fast"], "no-such-parameter": "1"}
    monkeypatch.setitem(mtk_presets.CONFIGS, "deterministic_quality_fast", bad)
    with pytest.raises(RuntimeError, match="use preset='deterministic_quality'"):
        partition(cloud[0], 2, method="hypergraph", graph=cloud[1],
                  preset="deterministic_quality_fast")  # fmt: skip
