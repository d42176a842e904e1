"""Partition's own checks: a record that is not a valid cut is refused at construction."""

from __future__ import annotations

import numpy as np
import pytest

from meshshard.partition import Partition
from meshshard.partition.record import shard_labels


def _valid():
    assignment = np.array([1, 0, 2, 1, 0, 1])
    order = np.array([1, 4, 0, 3, 5, 2])
    return assignment, order, np.array([2, 3, 1])


def test_shard_labels():
    assert shard_labels([2, 0, 3, 1]).tolist() == [0, 0, 2, 2, 2, 3]
    assert shard_labels([0, 0]).tolist() == []
    assert shard_labels([3], dtype=np.int16).dtype == np.int16


def test_valid_record_is_frozen():
    p = Partition(*_valid())
    assert p.offsets.tolist() == [0, 2, 5, 6]
    with pytest.raises(ValueError):
        p.order[0] = 3  # read-only


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a, o, s: (a, np.array([1, 4, 0, 3, 5, 5]), s), "not a permutation"),
        (lambda a, o, s: (a, np.array([1, 0, 4, 3, 5, 2]), s), "contiguous in shard order"),
        (lambda a, o, s: (a, np.array([0, 3, 1, 4, 5, 2]), s), "contiguous in shard order"),
        (lambda a, o, s: (a, o, np.array([2, 2, 2])), "bincount"),
        (lambda a, o, s: (np.array([1, 0, 3, 1, 0, 1]), o, s), "assignment values must lie"),
        (lambda a, o, s: (a, o, np.array([3, 3, 1])), "sum to N=6"),
        (lambda a, o, s: (a, o[:5], s), "order has 5 rows"),
    ],
)
def test_invalid_records_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        Partition(*change(*_valid()))
