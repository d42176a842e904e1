from __future__ import annotations

import numpy as np
import pytest

from meshshard.partition import partition, rcb


@pytest.mark.parametrize("parts", [1, 2, 3, 5, 6, 7, 12])
def test_rcb_any_part_count_gives_balanced_disjoint_boxes(parts):
    rng = np.random.default_rng(parts)
    pts = rng.random((1201, 3)) * [4.0, 1.0, 2.0]
    p = rcb(pts, parts)
    assert p.sizes.sum() == 1201
    assert p.sizes.max() - p.sizes.min() <= 2
    # boxes of different shards never overlap in their interiors (distinct coordinates)
    boxes = [(pts[p.shard_rows(i)].min(0), pts[p.shard_rows(i)].max(0)) for i in range(parts)]
    for i in range(parts):
        for j in range(i + 1, parts):
            lo = np.maximum(boxes[i][0], boxes[j][0])
            hi = np.minimum(boxes[i][1], boxes[j][1])
            assert (hi <= lo).any(), (i, j)


def test_rcb_splits_longest_axis_first():
    pts = np.random.default_rng(0).random((400, 2)) * [10.0, 1.0]
    p = rcb(pts, 2)
    left, right = pts[p.shard_rows(0)], pts[p.shard_rows(1)]
    assert left[:, 0].max() <= right[:, 0].min()


def test_rcb_weights_and_targets():
    rng = np.random.default_rng(1)
    pts = rng.random((3000, 3))
    p = rcb(pts, 3, targets=[0.5, 0.25, 0.25])
    assert np.abs(p.sizes - np.array([1500, 750, 750])).max() <= 1
    w = np.where(pts[:, 0] < 0.5, 10.0, 1.0)
    q = partition(pts, 4, method="rcb", weights=w)
    loads = np.bincount(q.assignment, weights=w, minlength=4)
    assert np.abs(loads / loads.mean() - 1).max() < 0.02
    assert q.sizes.max() > 2 * q.sizes.min()  # uneven shards by design
    e = rcb(pts, 4, targets=[0.0, 0.5, 0.0, 0.5])
    assert e.sizes[0] == 0 and e.sizes[2] == 0 and e.sizes.sum() == 3000


def test_rcb_tiny_inputs_and_determinism():
    pts = np.random.default_rng(2).random((3, 3))
    p = rcb(pts, 5, allow_empty=True)
    assert p.sizes.sum() == 3 and (p.sizes <= 1).all()
    big = np.random.default_rng(3).random((500, 3))
    assert rcb(big, 6) == rcb(big.copy(), 6)
    assert (rcb(pts, 3).sizes == 1).all()
