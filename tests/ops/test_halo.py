"""Halo exchange against the plan applied to the gathered features, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard.testing.distributed import run_ranks
from tests.ops._data import knn_halo_plan
from tests.ops._fns import _weights, halo_cases
from tests.ops._oracle import full

LAYOUTS = {2: [3, 5], 4: [1, 0, 6, 33]}
_RESULTS: dict[int, tuple] = {}


def results(P: int, tmp_path_factory) -> tuple:
    """Run the halo, gather and scatter cases once per world size (shared with
    test_gather_scatter.py)."""
    if P not in _RESULTS:
        sizes = LAYOUTS[P]
        x = full({"x_sizes": sizes, "method": "random"}, P)
        plan = knn_halo_plan(x, sizes, k=3)
        d = tmp_path_factory.mktemp(f"plan{P}")
        plan.save(d)
        _RESULTS[P] = (sizes, plan, run_ranks(halo_cases, P, sizes, str(d)))
    return _RESULTS[P]


@pytest.mark.parametrize("P", [2, 4])
def test_halo_exchange(P: int, tmp_path_factory) -> None:
    sizes, plan, res = results(P, tmp_path_factory)
    N = sum(sizes)
    feats = torch.arange(N * 2, dtype=torch.float64).reshape(N, 2).requires_grad_()
    off = np.asarray(plan.offsets)
    loss = 0
    for p, r in enumerate(res):
        local = feats[off[p] : off[p + 1]]
        want = torch.cat([local, feats[torch.as_tensor(plan.recv_idx[p]).long()]])
        assert plan.halo_sizes()[p] == r["halo"].shape[0] - sizes[p]
        np.testing.assert_array_equal(r["halo"], want.detach().numpy())
        loss = loss + (want * _weights(want.shape, p)).sum()
    loss.backward()
    assert plan.halo_sizes().sum() > 0  # the plan really moves rows
    np.testing.assert_allclose(np.concatenate([r["halo_grad"] for r in res]), feats.grad)


def test_halo_exchange_with_library_plan(tmp_path) -> None:
    """A geometric plan from meshshard.partition (Hilbert shards, radius halos): ghosts are
    exactly the other shards' points within r, in the plan's order."""
    from meshshard.partition import halo_plan_radius, partition
    from tests.ops._data import cloud

    pts = cloud(400, "clustered", seed=2)
    part = partition(pts, 4, method="hilbert")
    plan = halo_plan_radius(part, pts, 0.02)
    plan.save(tmp_path)
    sizes = part.sizes.tolist()
    res = run_ranks(halo_cases, 4, sizes, str(tmp_path))
    stored = part.apply(pts)
    off = part.offsets
    N = sum(sizes)
    feats = torch.arange(N * 2, dtype=torch.float64).reshape(N, 2)
    for p, r in enumerate(res):
        ghosts = r["halo"][sizes[p] :]
        np.testing.assert_array_equal(ghosts, feats[torch.as_tensor(plan.recv_idx[p])].numpy())
        # geometric check: ghost rows are the remote points within r of shard p
        mine = stored[off[p] : off[p + 1]]
        d = np.sqrt(((stored[:, None, :] - mine[None]) ** 2).sum(-1)).min(1)
        want = np.nonzero(d <= 0.02)[0]
        want = want[(want < off[p]) | (want >= off[p + 1])]
        np.testing.assert_array_equal(np.sort(plan.recv_idx[p]), want)
    assert plan.halo_sizes().sum() > 0
