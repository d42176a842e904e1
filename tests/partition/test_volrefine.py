from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from meshshard.partition import (
    communication_volume,
    knn_graph,
    metis,
    metrics,
    refine_volume,
)
from meshshard.partition.graphpart import metis_seeds
from tests.partition._refine_data import _brute_volume, _grid, _slabs


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_refine_lowers_volume_and_count_matches_brute_force(cloud, trimesh, parts):
    for pts, g in (cloud, trimesh):
        a = _slabs(pts[:, 0], np.ones(len(pts)), np.full(parts, 1 / parts))
        before = _brute_volume(g, a)
        b = refine_volume(g, a, parts)
        after = _brute_volume(g, b)
        assert communication_volume(g, b, parts) == after
        assert communication_volume(g, a, parts) == before
        assert after < before  # a slab cut of a random graph is far from a local optimum
        loads = np.bincount(b, minlength=parts)
        assert loads.max() <= np.floor(1.03 * len(pts) / parts)


def test_balance_weighted_nonuniform_and_zero_target(cloud):
    pts, g = cloud
    w = np.random.default_rng(3).uniform(0.2, 3.0, len(pts))
    for targets, uf in (([0.25] * 4, 30), ([0.5, 0.3, 0.0, 0.2], 30), ([0.4, 0.0, 0.6], 5)):
        t = np.asarray(targets)
        P = t.size
        a = _slabs(pts[:, 0], w, t)
        cap = (1 + uf / 1000) * t * w.sum()
        load_in = np.bincount(a, weights=w, minlength=P)
        assert (load_in <= cap + 1e-9).all()  # the input is within balance
        b = refine_volume(g, a, P, weights=w, targets=t, ufactor=uf)
        load = np.bincount(b, weights=w, minlength=P)
        assert (load <= cap + 1e-9).all()
        assert (np.bincount(b, minlength=P)[t == 0] == 0).all()  # zero targets stay empty
        assert _brute_volume(g, b) < _brute_volume(g, a)


def test_part_over_its_cap_only_shrinks():
    g = _grid(12, 12)
    a = (np.arange(144) % 12 >= 3).astype(np.int64)  # part 1 holds 108 of 144: far over cap
    b = refine_volume(g, a, 2)
    assert np.bincount(b, minlength=2)[1] <= 108
    assert _brute_volume(g, b) <= _brute_volume(g, a)


def test_deterministic_for_a_seed(trimesh):
    pts, g = trimesh
    a = _slabs(pts[:, 1], np.ones(len(pts)), [0.25] * 4)
    for seed in (0, 7):
        b1 = refine_volume(g, a, 4, seed=seed)
        b2 = refine_volume(g, a.copy(), 4, seed=seed)
        np.testing.assert_array_equal(b1, b2)
    assert a.tolist() == _slabs(pts[:, 1], np.ones(len(pts)), [0.25] * 4).tolist()  # input kept


def test_optimal_partitions_are_unchanged():
    cycle = sp.diags([1, 1, 1, 1], [-1, 1, -19, 19], shape=(20, 20), format="csr", dtype=int)
    halves = np.repeat([0, 1], 10)
    assert _brute_volume(cycle, halves) == 4  # a balanced 2-cut of a cycle moves >= 4 rows
    np.testing.assert_array_equal(refine_volume(cycle, halves, 2, ufactor=100), halves)
    blocks = sp.block_diag([_grid(5, 5)] * 3).tocsr()  # three components, one per part
    comp = np.repeat([2, 0, 1], 25)
    np.testing.assert_array_equal(refine_volume(blocks, comp, 3), comp)
    one = refine_volume(_grid(4, 4), np.zeros(16, dtype=int), 1)
    assert one.tolist() == [0] * 16


def test_metis_refine_and_tries_keep_the_best(trimesh):
    pts, g = trimesh
    kw = {"graph": g, "objective": "vol"}
    plain = metis(pts, 4, **kw)
    ref = metis(pts, 4, refine="volume", **kw)
    vol = lambda p: metrics(p, graph=g)["comm_volume"]  # noqa: E731
    assert vol(ref) <= vol(plain)
    assert ref.params["try_volumes_unrefined"] == [vol(plain)]
    assert ref.params["try_volumes"] == [vol(ref)]
    best = metis(pts, 4, refine=True, tries=3, seed=5, **kw)
    tv = best.params["try_volumes"]
    assert len(tv) == 3 and len(best.params["try_volumes_unrefined"]) == 3
    assert vol(best) == min(tv)
    assert best.params["try_seeds"] == [5, 6, 7]
    assert best.params["best_seed"] == 5 + tv.index(min(tv))
    again = metis(pts, 4, refine="volume", seed=best.params["best_seed"], **kw)
    np.testing.assert_array_equal(again.assignment, best.assignment)
    for s, v in zip(range(5, 8), tv):  # each try is that seed's refined partition
        assert vol(metis(pts, 4, refine="volume", seed=s, **kw)) == v
    assert best.sizes.max() <= np.floor(1.03 * len(pts) / 4)
    # METIS gives seeds 0 and 1 the same partition: tries from 0 skip 1
    assert metis_seeds(0, 3) == [0, 2, 3] and metis_seeds(1, 2) == [1, 2]
    assert metis(pts, 4, tries=2, **kw).params["try_seeds"] == [0, 2]
    cut = metis(pts, 3, graph=g, tries=2)  # edge-cut objective, no refinement: fewest cut edges
    cuts = cut.params["try_edge_cuts"]
    assert metrics(cut, graph=g)["edge_cut"] == min(cuts) and cut.params["refine"] is None


def test_metis_refine_on_the_knn_graph_it_builds(cloud):
    pts, _ = cloud  # no graph given: METIS and FM run on the kNN-8 graph in its vertex order
    g8 = knn_graph(pts, 8)
    plain, ref = metis(pts, 3, objective="vol"), metis(pts, 3, objective="vol", refine="volume")
    v = metrics(ref, graph=g8)["comm_volume"]
    assert ref.params["try_volumes"] == [v] and v < metrics(plain, graph=g8)["comm_volume"]
    assert ref.params["try_volumes_unrefined"] == [metrics(plain, graph=g8)["comm_volume"]]


def test_bad_inputs_raise_clear_errors():
    g = _grid(4, 4)
    a = np.repeat([0, 1], 8)
    with pytest.raises(ValueError, match=r"shape \(16,\)"):
        refine_volume(g, a[:-1], 2)
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        refine_volume(g, a + 1, 2)
    with pytest.raises(ValueError, match="integer part labels"):
        refine_volume(g, a.astype(float), 2)
    with pytest.raises(ValueError, match="parts=0"):
        refine_volume(g, a, 0)
    for name in ("passes", "window"):
        with pytest.raises(ValueError, match=f"{name}=0"):
            refine_volume(g, a, 2, **{name: 0})
    with pytest.raises(ValueError, match="ufactor"):
        refine_volume(g, a, 2, ufactor=-1)
    with pytest.raises(ValueError, match="seed"):
        refine_volume(g, a, 2, seed=-1)
    with pytest.raises(ValueError, match="targets"):
        refine_volume(g, a, 2, targets=[0.5, 0.6])
    with pytest.raises(ValueError, match="weights"):
        refine_volume(g, a, 2, weights=np.ones(3))
    asym = g.tolil()
    asym[0, 5] = 1
    with pytest.raises(ValueError, match="not symmetric"):
        refine_volume(asym.tocsr(), a, 2)
    with pytest.raises(TypeError, match="scipy.sparse"):
        refine_volume(g.toarray(), a, 2)
    pts = np.random.default_rng(0).random((100, 3))
    with pytest.raises(ValueError, match="refine='fm'"):
        metis(pts, 2, refine="fm")
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="tries="):
            metis(pts, 2, tries=bad)
