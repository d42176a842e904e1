"""The chunked distributed kNN (``knn_chunks``) against single-process oracles (brute force
float64 and cKDTree on the gathered data) and against the all-at-once ``knn``, on uneven
layouts, with one backward per chunk."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshshard.testing import RankCases, run_ranks
from tests.ops._chunk_fns import knn_chunk_cases, knn_chunk_st
from tests.ops._data import oracle_knn
from tests.ops._oracle import assert_knn_matches_oracle, full

CASES = RankCases(knn_chunk_cases, {
    2: [
        {"x_sizes": [3, 5], "k": 8, "chunk": 1},  # k = N, one query per round
        {"x_sizes": [3, 5], "k": 7, "loop": False, "chunk": 2},  # k = N - 1
        {"x_sizes": [0, 8], "k": 4, "loop": False, "chunk": 3},
        {"x_sizes": [0, 80], "k": 6, "loop": False, "chunk": 7, "kind": "clustered"},
        {"x_sizes": [30, 50], "k": 6, "loop": False, "chunk": 9, "kind": "dupes"},  # ties
        {"x_sizes": [30, 50], "y_sizes": [20, 0], "k": 5, "chunk": 6},
        {"x_sizes": [35, 45], "k": 7, "loop": False, "chunk": 10, "method": "random",
         "nboxes": 1},
        {"x_sizes": [30, 50], "k": 5, "chunk": 1000, "loop": False},  # one round
        {"x_sizes": [30, 50], "k": 5, "chunk": 8, "backend": "brute", "kind": "dupes"},
    ],
    3: [
        {"x_sizes": [1, 1, 6], "k": 5, "loop": False, "chunk": 1},
        {"x_sizes": [1, 1, 6], "y_sizes": [0, 4, 1], "k": 8, "chunk": 2},
    ],
    4: [
        {"x_sizes": [1, 1, 6, 72], "k": 6, "loop": False, "chunk": 5},
        {"x_sizes": [20, 0, 30, 30], "k": 8, "chunk": 4, "kind": "clustered",
         "method": "random"},
        {"x_sizes": [300], "k": 8, "loop": False, "chunk": 17, "method": "hilbert",
         "kind": "clustered"},
        {"x_sizes": [300], "k": 8, "chunk": 64, "method": "metis"},
    ],
})


@pytest.mark.parametrize(("P", "ci"), CASES.params())
def test_knn_chunks_match_oracle(P: int, ci: int) -> None:
    case, per_rank = CASES.case(P, ci), CASES.per_rank(P, ci)
    # every rank ran the same rounds; its spans tile its own rows in order
    m = [r["index"].shape[0] for r in per_rank]
    rounds = math.ceil(max(m) / case["chunk"])
    for r, mr in zip(per_rank, m):
        assert r["rounds"] == rounds == len(r["spans"])
        assert [a for a, _ in r["spans"]] == [min(j * case["chunk"], mr) for j in range(rounds)]
        assert r["spans"][-1][1] == mr if rounds else mr == 0
    assert_knn_matches_oracle(case, P, per_rank)
    for r in per_rank:  # bitwise the all-at-once kNN's answer
        np.testing.assert_array_equal(r["index"], r["index_all"])
        np.testing.assert_array_equal(r["dist"], r["dist_all"])


@pytest.mark.parametrize("sizes", [[3, 5], [0, 8]])
def test_knn_chunks_shardtensor_float32(sizes: list[int]) -> None:
    per_rank = run_ranks(knn_chunk_st, 2, sizes, 3, 2)
    x = full({"x_sizes": sizes}, 2, "x").astype(np.float32).astype(np.float64)
    want = oracle_knn(x, x, 3, exclude_self=True)
    np.testing.assert_array_equal(np.concatenate([r["index"] for r in per_rank]), want)
    for r in per_rank:
        assert r["dist"].dtype == np.float32
        np.testing.assert_array_equal(r["index"], r["index_all"])
        np.testing.assert_array_equal(r["dist"], r["dist_all"])


def test_knn_chunks_bad_chunk() -> None:
    import torch

    from meshshard.ops import knn_chunks

    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_queries_per_chunk"):
            next(knn_chunks(torch.zeros(4, 3), 2, max_queries_per_chunk=bad))


def test_knn_chunks_search_is_local_for_coherent_rows() -> None:
    """Rows in curve order: each round searches a few blocks; shuffled rows: every block
    (still exact). This is what bounds the memory of a round."""
    from tests.ops._chunk_fns import knn_chunk_cost

    n, chunk = 4000, 100
    for shuffle in (False, True):
        per_rank = run_ranks(knn_chunk_cost, 2, n, chunk, shuffle)
        for r in per_rank:
            assert r["equal"]
            per_round = r["rows_searched"] / (r["rounds"] * chunk)  # blocks per round
            if shuffle:
                assert per_round >= r["rows"] / chunk  # the whole shard, at least once a round
            else:
                assert per_round <= 8, per_round
