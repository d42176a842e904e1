"""Distributed radius (ball) queries and knn/radius graphs against single-process oracles."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import cKDTree

from meshshard.testing import RankCases, run_ranks
from tests.ops._data import oracle_knn, oracle_radius
from tests.ops._fns import graph_cases, radius_cases
from tests.ops._oracle import assert_grads_match, full, full_weights, gathered, radius_grads

CASES = RankCases(radius_cases, {
    2: [
        {"x_sizes": [30, 50], "r": 0.25},
        {"x_sizes": [0, 80], "r": 0.3, "loop": False},
        {"x_sizes": [35, 45], "r": 0.05, "kind": "clustered", "method": "random", "loop": False},
        {"x_sizes": [30, 50], "r": 1.0, "kind": "dupes", "cap": 4},  # ties + closest kept
        {"x_sizes": [30, 50], "y_sizes": [0, 20], "r": 0.3, "cap": 3},
        {"x_sizes": [30, 50], "r": 0.25, "backend": "brute", "loop": False},
        # the device cell list (backend="grid"), on uneven layouts, ties and clusters
        {"x_sizes": [3, 5], "r": 0.6, "backend": "grid"},
        {"x_sizes": [0, 8], "r": 0.5, "loop": False, "backend": "grid", "cap": 3},
        {"x_sizes": [35, 45], "r": 0.05, "kind": "clustered", "method": "random", "loop": False,
         "backend": "grid"},
        {"x_sizes": [30, 50], "r": 1.0, "kind": "dupes", "cap": 4, "backend": "grid"},
        {"x_sizes": [30, 50], "y_sizes": [0, 20], "r": 0.3, "cap": 3, "backend": "grid"},
    ],
    3: [
        {"x_sizes": [1, 1, 6], "r": 0.7, "backend": "grid"},
        {"x_sizes": [1, 1, 6], "r": 0.7, "loop": False, "cap": 2, "backend": "grid"},
        {"x_sizes": [300], "r": 0.05, "method": "rcb", "kind": "clustered", "backend": "grid"},
    ],
    4: [
        {"x_sizes": [1, 1, 6, 72], "r": 0.3, "loop": False},
        {"x_sizes": [20, 0, 30, 30], "r": 0.05, "kind": "clustered", "method": "random"},
        {"x_sizes": [300], "r": 0.15, "loop": False, "method": "hilbert"},
        {"x_sizes": [300], "r": 0.03, "method": "metis", "kind": "clustered", "cap": 6},
    ],
})


@pytest.mark.parametrize(("P", "ci"), CASES.params())
def test_radius_matches_oracle(P: int, ci: int) -> None:
    case, per_rank = CASES.case(P, ci), CASES.per_rank(P, ci)
    g = gathered(case, P)
    want = oracle_radius(
        g.x, g.queries, case["r"], exclude_self=g.exclude_self, cap=case.get("cap")
    )
    got = []
    for r in per_rank:
        got += [r["index"][a:b] for a, b in zip(r["ptr"][:-1], r["ptr"][1:])]
    assert len(got) == len(want)
    for i, (nb, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(nb, w, err_msg=f"query {i} of case {case}")
    if "cap" not in case and case.get("kind") != "dupes":  # cKDTree sets
        ref = cKDTree(g.x).query_ball_point(g.queries, r=case["r"])
        for nb, s, i in zip(got, ref, range(len(got))):
            s = set(s) - ({i} if g.exclude_self else set())
            assert set(nb.tolist()) == s
    # padded format: same lists, width = cap or the global max count
    width = case.get("cap") or max(len(w) for w in want)
    pad_i = np.concatenate([r["pad_index"] for r in per_rank])
    pad_d = np.concatenate([r["pad_dist"] for r in per_rank])
    assert pad_i.shape == (g.queries.shape[0], width)
    for i, w in enumerate(want):
        np.testing.assert_array_equal(pad_i[i, : len(w)], w)
        assert (pad_i[i, len(w) :] == -1).all() and np.isinf(pad_d[i, len(w) :]).all()
    # distances and gradients against single-process autograd
    wts = full_weights([r["dist"].shape for r in per_rank])
    assert_grads_match(per_rank, *radius_grads(g.x, g.y, want, wts))
    # the padded path's gradient (capped: the static-shape path) equals the CSR's, same pairs
    for r in per_rank:
        np.testing.assert_allclose(r["pad_gx"], r["unit_gx"], atol=1e-12)
        if g.y is not None:
            np.testing.assert_allclose(r["pad_gy"], r["unit_gy"], atol=1e-12)


def test_graphs_follow_torch_cluster_convention() -> None:
    """knn_graph / radius_graph: flow='source_to_target' puts the neighbour in row 0 and the
    centre in row 1 (torch_cluster's knn_graph default); 'target_to_source' the reverse."""
    sizes = [7, 0, 13, 20]
    res = run_ranks(graph_cases, 4, sizes)
    x = full({"x_sizes": sizes}, 4)
    N = x.shape[0]
    centres = np.repeat(np.arange(N), 3)

    st = np.concatenate([r["knn_st"] for r in res], 1)
    np.testing.assert_array_equal(st[1], centres)
    np.testing.assert_array_equal(st[0], oracle_knn(x, x, 3, exclude_self=True).reshape(-1))
    ts = np.concatenate([r["knn_ts_loop"] for r in res], 1)
    np.testing.assert_array_equal(ts[0], centres)
    np.testing.assert_array_equal(ts[1], oracle_knn(x, x, 3).reshape(-1))
    assert (ts[0] == ts[1]).sum() == N  # loop=True: every point is its own nearest

    want = oracle_radius(x, x, 0.3, exclude_self=True)
    rs = np.concatenate([r["rad_st"] for r in res], 1)
    np.testing.assert_array_equal(rs[0], np.concatenate(want))
    np.testing.assert_array_equal(rs[1], np.repeat(np.arange(N), [len(w) for w in want]))
    want = oracle_radius(x, x, 0.3, exclude_self=True, cap=2)
    rc = np.concatenate([r["rad_ts_cap"] for r in res], 1)
    np.testing.assert_array_equal(rc[1], np.concatenate(want))
    np.testing.assert_array_equal(rc[0], np.repeat(np.arange(N), [len(w) for w in want]))
