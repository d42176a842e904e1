"""Distributed kNN against single-process oracles (brute force float64 and cKDTree)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import cKDTree

from meshshard.testing.distributed import run_ranks
from tests.ops._data import oracle_knn
from tests.ops._fns import knn_cases
from tests.ops._oracle import full, full_weights, knn_grads

CASES = {
    2: [
        {"x_sizes": [30, 50], "k": 5},
        {"x_sizes": [3, 5], "k": 8},  # k = N
        {"x_sizes": [3, 5], "k": 7, "loop": False},  # k = N - 1
        {"x_sizes": [0, 80], "k": 4, "loop": False},
        {"x_sizes": [35, 45], "k": 7, "loop": False, "kind": "clustered", "method": "random"},
        {"x_sizes": [30, 50], "k": 6, "loop": False, "kind": "dupes"},  # exact ties
        {"x_sizes": [30, 50], "y_sizes": [20, 0], "k": 5},
        {"x_sizes": [2, 60], "y_sizes": [25, 15], "k": 5, "method": "random", "nboxes": 1},
        {"x_sizes": [30, 50], "k": 5, "backend": "brute", "kind": "dupes"},
        # the device cell list (backend="grid"), on uneven layouts, ties and clusters
        {"x_sizes": [3, 5], "k": 8, "backend": "grid"},
        {"x_sizes": [0, 8], "k": 4, "loop": False, "backend": "grid"},
        {"x_sizes": [35, 45], "k": 7, "loop": False, "kind": "clustered", "method": "random",
         "backend": "grid"},
        {"x_sizes": [30, 50], "k": 6, "loop": False, "kind": "dupes", "backend": "grid"},
        {"x_sizes": [30, 50], "y_sizes": [20, 0], "k": 5, "backend": "grid"},
    ],
    3: [
        {"x_sizes": [1, 1, 6], "k": 5, "backend": "grid"},
        {"x_sizes": [1, 1, 6], "k": 7, "loop": False, "backend": "grid"},
        {"x_sizes": [300], "k": 8, "method": "rcb", "kind": "clustered", "backend": "grid"},
    ],
    4: [
        {"x_sizes": [1, 1, 6, 72], "k": 6, "loop": False},
        {"x_sizes": [20, 0, 30, 30], "k": 8, "kind": "clustered", "method": "random"},
        {"x_sizes": [25, 25, 15, 15], "k": 5, "kind": "dupes", "loop": False},
        {"x_sizes": [1, 1, 1, 1], "y_sizes": [10, 0, 5, 5], "k": 3, "method": "random"},
        # the library's partitioners (sizes are theirs), uniform and strongly clustered clouds
        {"x_sizes": [300], "k": 8, "loop": False, "method": "morton"},
        {"x_sizes": [300], "k": 8, "loop": False, "method": "hilbert", "kind": "clustered"},
        {"x_sizes": [300], "k": 8, "method": "rcb", "kind": "clustered"},
        {"x_sizes": [300], "k": 8, "loop": False, "method": "metis"},
    ],
}

_RESULTS: dict[int, list] = {}


def _results(P: int) -> list:
    if P not in _RESULTS:
        _RESULTS[P] = run_ranks(knn_cases, P, CASES[P])
    return _RESULTS[P]


@pytest.mark.parametrize(("P", "ci"), [(P, i) for P, cs in CASES.items() for i in range(len(cs))])
def test_knn_matches_oracle(P: int, ci: int) -> None:
    case = CASES[P][ci]
    per_rank = [r[ci] for r in _results(P)]
    x = full(case, P, "x")
    y = full(case, P, "y") if "y_sizes" in case else None
    yq = x if y is None else y
    loop = case.get("loop", True)
    index = np.concatenate([r["index"] for r in per_rank])
    want = oracle_knn(x, yq, case["k"], exclude_self=y is None and not loop)
    np.testing.assert_array_equal(index, want, err_msg=f"case {case}")
    if case.get("kind", "uniform") != "dupes":  # cKDTree sets (no ties to break)
        _, ref = cKDTree(x).query(yq, k=case["k"] + (0 if loop or y is not None else 1))
        ref = np.asarray(ref).reshape(yq.shape[0], -1)
        if not loop and y is None:
            ref = ref[:, 1:]
        assert all(set(a) == set(b) for a, b in zip(index.tolist(), ref.tolist()))
    w = full_weights([r["dist"].shape for r in per_rank])
    d_ref, gx_ref, gy_ref = knn_grads(x, y, want, w)
    np.testing.assert_allclose(np.concatenate([r["dist"] for r in per_rank]), d_ref, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([r["gx"] for r in per_rank]), gx_ref, atol=1e-10)
    if y is not None:
        np.testing.assert_allclose(np.concatenate([r["gy"] for r in per_rank]), gy_ref, atol=1e-10)
