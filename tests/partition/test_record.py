"""Partition's own checks: a record that is not a valid cut is refused at construction."""

from __future__ import annotations

import json

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


def _two_partitions():
    a = Partition.from_assignment(np.array([0, 1, 1, 0, 2, 2, 1]), nparts=3, method="a")
    b = Partition.from_assignment(np.array([1, 0, 0, 1, 2, 2, 0]), nparts=3, method="b")
    assert a.sizes.tolist() == [2, 3, 2] and b.sizes.tolist() == [3, 2, 2]
    return a, b


def test_save_load_round_trip(tmp_path):
    a, _ = _two_partitions()
    back = Partition.load(a.save(tmp_path / "p"))
    assert back == a and back.method == "a"
    assert not list((tmp_path / "p").glob("*.tmp"))


def test_a_save_interrupted_between_the_renames_is_refused(tmp_path):
    """New arrays with the old metadata (a crash after the first rename): refused, not mixed,
    even where the sizes happen to agree."""
    a, b = _two_partitions()
    c = Partition.from_assignment(np.array([1, 0, 1, 2, 0, 1, 2]), nparts=3, method="c")
    assert c.sizes.tolist() == a.sizes.tolist() and c != a
    old_json = (a.save(tmp_path / "p") / "partition.json").read_bytes()
    c.save(tmp_path / "p")
    (tmp_path / "p" / "partition.json").write_bytes(old_json)
    with pytest.raises(ValueError, match="different saves"):
        Partition.load(tmp_path / "p")
    b.save(tmp_path / "p")  # a later complete save repairs it
    assert Partition.load(tmp_path / "p") == b


def test_truncated_arrays_are_named(tmp_path):
    a, _ = _two_partitions()
    d = a.save(tmp_path / "p")
    meta = json.loads((d / "partition.json").read_text())
    del meta["npz_sha256"]  # a save from before the checksum: the reader still names the file
    (d / "partition.json").write_text(json.dumps(meta))
    blob = (d / "partition.npz").read_bytes()
    (d / "partition.npz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ValueError, match="unreadable or truncated"):
        Partition.load(d)
