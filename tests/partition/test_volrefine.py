"""The k-way FM ghost-row refiner (refine_volume): what only it does (an optimal cut kept,
METIS with refine and tries, its options). What both refiners guarantee is checked in
test_refiners.py."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from meshshard.partition import knn_graph, metis, metrics, refine_volume
from meshshard.partition.graphpart import metis_seeds
from tests.partition._refine_data import _brute_volume, _grid


def test_an_optimal_cut_of_a_cycle_is_unchanged():
    """A balanced 2-cut of a cycle no move can improve stays as it is."""
    cycle = sp.diags([1, 1, 1, 1], [-1, 1, -19, 19], shape=(20, 20), format="csr", dtype=int)
    halves = np.repeat([0, 1], 10)
    assert _brute_volume(cycle, halves) == 4  # a balanced 2-cut of a cycle moves >= 4 rows
    np.testing.assert_array_equal(refine_volume(cycle, halves, 2, ufactor=100), halves)


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


def test_bad_fm_options_raise_clear_errors():
    """The shared checks of both refiners are in test_refiners.py."""
    g = _grid(4, 4)
    a = np.repeat([0, 1], 8)
    with pytest.raises(ValueError, match="integer part labels"):
        refine_volume(g, a.astype(float), 2)
    with pytest.raises(ValueError, match="parts=0"):
        refine_volume(g, a, 0)
    for name in ("passes", "window"):
        with pytest.raises(ValueError, match=f"{name}=0"):
            refine_volume(g, a, 2, **{name: 0})
    with pytest.raises(ValueError, match="seed"):
        refine_volume(g, a, 2, seed=-1)
    with pytest.raises(ValueError, match="weights"):
        refine_volume(g, a, 2, weights=np.ones(3))
    asym = g.tolil()
    asym[0, 5] = 1
    with pytest.raises(ValueError, match="not symmetric"):
        refine_volume(asym.tocsr(), a, 2)
    pts = np.random.default_rng(0).random((100, 3))
    with pytest.raises(ValueError, match="refine='fm'"):
        metis(pts, 2, refine="fm")
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="tries="):
            metis(pts, 2, tries=bad)
