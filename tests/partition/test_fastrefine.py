"""The vectorised ghost-row refiner (refine_volume_fast): what only it does (random graphs,
its seed, its options, METIS and the other backends with refine="fast", hub degrees). What
both refiners guarantee is checked in test_refiners.py."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from meshshard.partition import communication_volume, knn_graph, metis, metrics
from meshshard.partition.fastrefine import refine_volume_fast
from tests.partition._refine_data import _brute_volume, _grid, _slabs


def test_never_worse_on_random_labels_and_graphs():
    rng = np.random.default_rng(4)
    for trial in range(12):
        n = int(rng.integers(5, 300))
        m = sp.random(n, n, density=float(rng.uniform(0.01, 0.2)), random_state=trial)
        g = ((m + m.T) > 0).astype(int).tolil()
        g.setdiag(0)
        g = g.tocsr()
        g.eliminate_zeros()
        parts = int(rng.integers(2, 7))
        a = rng.integers(0, parts, n)
        b = refine_volume_fast(g, a, parts, ufactor=1000, seed=trial)
        assert _brute_volume(g, b) <= _brute_volume(g, a)
        assert communication_volume(g, b, parts) == _brute_volume(g, b)


def test_the_seed_orders_the_ties(trimesh):
    pts, g = trimesh
    a = _slabs(pts[:, 1], np.ones(len(pts)), [0.25] * 4)
    seed0, seed7 = (refine_volume_fast(g, a, 4, seed=seed) for seed in (0, 7))
    assert not np.array_equal(seed0, seed7)


def test_metis_refine_fast_records_and_reproduces(trimesh):
    pts, g = trimesh
    kw = {"graph": g, "objective": "vol"}
    plain = metis(pts, 4, **kw)
    fast = metis(pts, 4, refine="fast", **kw)
    vol = lambda p: metrics(p, graph=g)["ghost_rows"]["1"]  # noqa: E731
    assert fast.params["refine"] == "fast"
    assert fast.params["try_volumes_unrefined"] == [vol(plain)]
    assert fast.params["try_volumes"] == [vol(fast)] == [_brute_volume(g, fast.assignment)]
    assert vol(fast) < vol(plain)
    np.testing.assert_array_equal(metis(pts, 4, refine="fast", **kw).assignment,
                                  fast.assignment)  # fmt: skip
    best = metis(pts, 4, refine="fast", tries=3, seed=5, **kw)
    assert vol(best) == min(best.params["try_volumes"])
    t = [0.5, 0.0, 0.2, 0.3]
    tw = metis(pts, 4, refine="fast", targets=t, **kw)
    assert tw.sizes[1] == 0
    assert (tw.sizes <= np.floor(1.03 * np.asarray(t) * len(pts)) + 1).all()


def test_bad_fast_options_raise_clear_errors():
    """The shared checks of both refiners are in test_refiners.py."""
    g = _grid(4, 4)
    a = np.repeat([0, 1], 8)
    with pytest.raises(ValueError, match="rounds=0"):
        refine_volume_fast(g, a, 2, rounds=0)
    pts = np.random.default_rng(0).random((100, 3))
    with pytest.raises(ValueError, match="'fast'"):
        metis(pts, 2, refine="fm")


@pytest.mark.parametrize("method", ["kaminpar", "hypergraph"])
def test_optional_backends_take_refine_fast(trimesh, method):
    from meshshard.partition import partition
    from meshshard.partition.hypergraph import WITH_MTKAHYPAR
    from meshshard.partition.kaminpar_part import WITH_KAMINPAR

    if not {"kaminpar": WITH_KAMINPAR, "hypergraph": WITH_MTKAHYPAR}[method]:
        pytest.skip(f"{method} backend not installed")
    pts, g = trimesh
    t = [0.3, 0.0, 0.45, 0.25]
    p = partition(pts, 4, method=method, graph=g, targets=t, refine="fast", seed=3)
    rows = _brute_volume(g, p.assignment)
    assert metrics(p, graph=g)["ghost_rows"]["1"] == rows == p.params["try_volumes"][0]
    assert rows <= p.params["try_volumes_unrefined"][0]
    assert p.sizes[1] == 0
    assert (p.sizes <= np.floor(1.03 * np.asarray(t) * len(pts)) + 1).all()
    again = partition(pts, 4, method=method, graph=g, targets=t, refine="fast", seed=3)
    np.testing.assert_array_equal(again.assignment, p.assignment)
    if method == "hypergraph":
        with pytest.raises(ValueError, match="rings=2"):
            partition(pts, 4, method=method, graph=g, rings=2, refine="fast")


def test_kaminpar_strong_rows_preset(trimesh, cloud):
    from meshshard.partition import partition
    from meshshard.partition.kaminpar_part import WITH_KAMINPAR, kaminpar_assignment

    if not WITH_KAMINPAR:
        pytest.skip("kaminpar not installed")
    for pts, g in (trimesh, cloud):
        strong = partition(pts, 5, method="kaminpar", graph=g, preset="strong", seed=2)
        rows = partition(pts, 5, method="kaminpar", graph=g, preset="strong_rows", seed=2)
        # the preset is KaMinPar strong, refined: its unrefined volume is strong's
        assert rows.params["try_volumes_unrefined"] == [_brute_volume(g, strong.assignment)]
        assert metrics(rows, graph=g)["ghost_rows"]["1"] == _brute_volume(g, rows.assignment)
        assert _brute_volume(g, rows.assignment) <= _brute_volume(g, strong.assignment)
        if g is cloud[1]:  # on the small 2-D mesh strong's partition is already a local optimum
            assert _brute_volume(g, rows.assignment) < _brute_volume(g, strong.assignment)
        assert rows.params["preset"] == "strong_rows" and rows.params["refine"] == "fast"
        again = partition(pts, 5, method="kaminpar", graph=g, preset="strong_rows", seed=2)
        np.testing.assert_array_equal(again.assignment, rows.assignment)
    w = np.random.default_rng(6).uniform(0.5, 2.0, len(pts))
    t = np.array([0.4, 0.0, 0.35, 0.25])
    tw = partition(pts, 4, method="kaminpar", graph=g, preset="strong_rows", weights=w,
                   targets=t)  # fmt: skip
    load = np.bincount(tw.assignment, weights=w, minlength=4)
    assert load[1] == 0 and (load <= 1.03 * t * w.sum() + 2 * w.max()).all()
    for bad in (False, True, "volume"):
        with pytest.raises(ValueError, match="strong_rows"):
            partition(pts, 4, method="kaminpar", graph=g, preset="strong_rows", refine=bad)
    with pytest.raises(ValueError, match="call kaminpar"):
        kaminpar_assignment(g, 4, preset="strong_rows")


def test_empty_graph_and_more_parts_than_rows():
    assert refine_volume_fast(sp.csr_matrix((0, 0), dtype=int), np.zeros(0, int), 3).size == 0
    pts = np.random.default_rng(0).random((5, 3))
    g = knn_graph(pts, 2)
    p = metis(pts, 8, graph=g, objective="vol", refine="fast", allow_empty=True)
    assert sorted(p.sizes.tolist()) == [0, 0, 0, 1, 1, 1, 1, 1]
    assert p.params["try_volumes"] == [_brute_volume(g, p.assignment)]


@pytest.mark.parametrize("hub", [254, 255, 300])
def test_neighbour_counts_hold_hub_degrees_past_the_narrow_type(hub):
    """The count table is uint8 below degree 255 and wider above: a hub whose neighbours all
    lie in one part (a count of ``hub``) and a boundary hub are counted exactly."""
    from meshshard.partition.fastrefine import _neighbour_counts

    rng = np.random.default_rng(hub)
    n = hub + 41
    rows = [0] * hub + [1] * hub
    cols = list(range(2, hub + 2)) + list(range(n - hub, n))
    extra = rng.integers(0, n, (2, 3 * n))
    m = sp.coo_matrix((np.ones(len(rows) + extra.shape[1]),
                       (rows + extra[0].tolist(), cols + extra[1].tolist())), shape=(n, n))
    g = ((m + m.T) > 0).astype(np.int32).tocsr()
    g.setdiag(0)
    g.eliminate_zeros()
    interior = np.zeros(n, dtype=np.int64)  # the hubs' rows hold only their degree
    boundary = interior.copy()
    boundary[[2, 3, n - 1]] = [1, 2, 1]  # the hubs touch parts 1 and 2, most in part 0
    for a, big in ((interior, True), (boundary, True), (rng.integers(0, 3, n), False)):
        got = _neighbour_counts(g.indptr.astype(np.int64), g.indices.astype(np.int64), a, 3)
        want = np.zeros((n, 3), dtype=np.int64)
        np.add.at(want, (np.repeat(np.arange(n), np.diff(g.indptr)), a[g.indices]), 1)
        assert not big or want.max() >= hub - 2
        np.testing.assert_array_equal(got.reshape(n, 3).astype(np.int64), want)
