"""Shard regions (boxes around runs of rows) and the run-then-row reach test against brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard.ops._regions import (
    box_mindist2,
    knn_forward_mask,
    near_ranks,
    near_ranks_dense,
    radius_send_mask,
    shard_boxes,
)


def _brute_near(y, reach2, boxes, rank):
    P, B, _ = boxes.shape
    d2 = box_mindist2(y, boxes.reshape(P * B, -1)).reshape(-1, P, B)
    full = boxes[None, :, :, -1] > 0  # empty boxes reach nothing, not even an inf reach
    mask = ((d2 <= reach2[:, None, None]) & full).any(-1)
    mask[:, rank] = False
    return mask


def _inside(x, boxes):
    d = x.shape[1]
    lo, hi = boxes[:, :d], boxes[:, d : 2 * d]
    xd = x.double()[:, None]
    return ((xd >= lo[None]) & (xd <= hi[None])).all(-1)


@pytest.mark.parametrize("n,nboxes", [(0, 4), (1, 4), (3, 8), (500, 1), (500, 7), (5000, 64)])
def test_shard_boxes_cover_every_row_once_by_count(n, nboxes):
    g = torch.Generator().manual_seed(n + nboxes)
    x = torch.rand(n, 3, generator=g)
    b = shard_boxes(x, nboxes)
    assert b.shape == (nboxes, 7)
    assert int(b[:, 6].sum()) == n
    if n:
        assert _inside(x, b).any(1).all()
    empty = b[:, 6] == 0
    assert torch.isinf(b[empty, :3]).all() and (b[empty, :3] > 0).all()


def test_shard_boxes_cut_at_jumps_between_patches():
    # rows alternate between two far patches in blocks of 100, as a space-filling curve that
    # leaves a patch and returns: no box may span the gap
    g = torch.Generator().manual_seed(0)
    parts = [torch.rand(100, 3, generator=g) + (50.0 if i % 2 else 0.0) for i in range(6)]
    x = torch.cat(parts)
    b = shard_boxes(x, 10)  # 5 cuts at the 5 jumps, 5 even ones
    ext = (b[:, 3:6] - b[:, 0:3])[b[:, 6] > 0]
    assert float(ext.max()) < 1.0
    assert int(b[:, 6].sum()) == 600


@pytest.mark.parametrize("order", ["sorted", "shuffled"])
@pytest.mark.parametrize("rank", [0, 2])
def test_near_ranks_equals_row_by_box_test(order, rank):
    g = torch.Generator().manual_seed(1)
    P, B = 4, 6
    # ranks' clouds 0.1 apart along x; sorted along x, each run of rows spans ~0.1 of it, so
    # runs near a gap reach across it and runs farther in do not
    pts = [torch.rand(5000 if q == rank else 700, 3, generator=g) * 0.5
           + torch.tensor([0.6 * q, 0, 0]) for q in range(P)]
    pts[1] = pts[1][:0]  # an empty rank: all its boxes empty
    boxes = torch.stack([shard_boxes(p, B) for p in pts])
    y = pts[rank]
    y = y[torch.argsort(y[:, 0])] if order == "sorted" else y[torch.randperm(len(y), generator=g)]
    reach2 = torch.rand(len(y), generator=g, dtype=torch.float64) * 0.05
    reach2[:300:97] = float("inf")  # in the first run only: the others keep a finite reach
    reach2[::89] = 0.0
    got = near_ranks(y, reach2, boxes, rank)
    want = _brute_near(y, reach2, boxes, rank)
    assert torch.equal(got, want)
    assert got.any() and not got.all()
    assert torch.equal(near_ranks_dense(y, reach2, boxes, rank), want)  # the device path


def test_masks_of_the_ops_equal_brute_force():
    g = torch.Generator().manual_seed(2)
    P, B = 3, 5
    pts = [torch.rand(1500, 2, generator=g) + torch.tensor([0.9 * q, 0.0]) for q in range(P)]
    boxes = torch.stack([shard_boxes(p, B) for p in pts])
    bound2 = torch.rand(1500, generator=g, dtype=torch.float64) * 0.01
    bound2[:7] = float("inf")  # a shard with fewer than k rows: bound from the boxes
    mask, b2 = knn_forward_mask(pts[1], bound2, boxes, 1, 4)
    assert torch.isfinite(b2).all() and torch.equal(b2[7:], bound2[7:])
    assert torch.equal(mask, _brute_near(pts[1], b2, boxes, 1))
    smask = radius_send_mask(pts[0], 0.05, boxes, 0)
    lim = torch.full((1500,), (0.05 * (1 + 1e-9)) ** 2, dtype=torch.float64)
    assert torch.equal(smask, _brute_near(pts[0], lim, boxes, 0))
    assert smask[:, 1].any() and not smask[:, 2].any()  # rank 2 lies beyond the radius


def test_row_blocks_cut_at_jumps_and_stay_exact():
    from scipy.spatial import cKDTree

    from meshshard.ops._blocks import RowBlocks

    # rows alternate between two far patches every 40 rows (a curve that leaves and returns)
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.rand(40, 3, generator=g) * 0.1 + (5.0 if i % 2 else 0.0)
                   for i in range(10)])
    rb = RowBlocks(x, 100, backend="kdtree")
    assert len(rb.start) > 4  # 4 blocks of 100 rows, cut again at their jumps
    assert rb.start[0] == 0 and rb.stop[-1] == 400
    assert all(b - a <= 100 for a, b in zip(rb.start, rb.stop, strict=True))
    ext = (rb.hi - rb.lo).amax(1)
    assert float(ext.max()) < 1.0  # no piece spans the gap
    q = x[:100]
    d2, ii = rb.local_knn(q, 6)
    want_d, want_i = cKDTree(x.double().numpy()).query(q.double().numpy(), 6)
    assert np.allclose(np.sqrt(d2.numpy()), want_d, rtol=1e-6, atol=1e-7)
    assert (ii.numpy() == want_i).mean() > 0.99  # equal up to float32-distance ties
