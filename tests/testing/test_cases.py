"""RankCases: cases per world size, each world size's cases run once on real ranks."""

from __future__ import annotations

import pytest

from meshshard.testing import RankCases, run_ranks
from tests.testing import _fns


def test_params_and_cases_in_order():
    cases = RankCases(_fns.case_squares, {2: [{"n": 3}, {"n": 4}], 3: [{"n": 5}]})
    assert cases.params() == [(2, 0), (2, 1), (3, 0)]
    assert cases.case(2, 1) == {"n": 4} and cases.case(3, 0) == {"n": 5}


def test_each_world_size_runs_once_and_results_are_per_case(monkeypatch):
    calls = []

    def counting(fn, world_size, *args, **kw):
        calls.append((world_size, kw))
        return run_ranks(fn, world_size, *args, **kw)

    monkeypatch.setattr("meshshard.testing.cases.run_ranks", counting)
    cases = RankCases(_fns.case_squares, {2: [{"n": 3}, {"n": 4}]}, timeout=60)
    assert cases.per_rank(2, 1) == [(0, 2, 16), (1, 2, 16)]
    assert cases.per_rank(2, 0) == [(0, 2, 9), (1, 2, 9)]
    assert calls == [(2, {"timeout": 60})]
    with pytest.raises(KeyError):
        cases.per_rank(4, 0)
