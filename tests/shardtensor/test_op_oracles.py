"""op(sharded).full_tensor() == op(full), forward and gradients, for every op family on uneven
layouts (including empty shards) on real gloo ranks."""

import pytest

from meshshard.testing import run_ranks
from tests.shardtensor._cases import CASES, run_cases

LAYOUTS = [(3, 5), (0, 8), (1, 1, 6), (2, 0, 5, 1)]
_results: dict = {}


def _result(layout):
    if layout not in _results:
        per_rank = run_ranks(run_cases, len(layout), layout, timeout=300)
        merged = {}
        for rank, res in enumerate(per_rank):
            for k, v in res.items():
                if v and k not in merged:
                    merged[k] = f"rank {rank}:\n{v}"
                merged.setdefault(k, None)
        _results[layout] = merged
    return _results[layout]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("key", [f"{fam}/{name}" for fam, name, _, _ in CASES])
def test_op_matches_single_process(layout, key):
    res = _result(layout)
    assert key in res, f"case {key} did not run"
    assert res[key] is None, res[key]
