"""Distributed kNN against single-process oracles (brute force float64 and cKDTree)."""

from __future__ import annotations

import pytest

from meshshard.testing import RankCases
from tests.ops._fns import knn_cases
from tests.ops._oracle import assert_knn_matches_oracle

CASES = RankCases(knn_cases, {
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
})


@pytest.mark.parametrize(("P", "ci"), CASES.params())
def test_knn_matches_oracle(P: int, ci: int) -> None:
    assert_knn_matches_oracle(CASES.case(P, ci), P, CASES.per_rank(P, ci))
