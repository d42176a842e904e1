"""Checks that need GPUs (the ``gpu`` marker: skipped cleanly without them). On a CPU-only
host the same properties are proxied by the meta-device placement test, the sync census and
the p2p census on gloo (see docs/guide/gpus.md)."""

from __future__ import annotations

import pytest

from meshshard.testing import run_ranks
from tests._gpu_fns import ring_attention_nccl


@pytest.mark.gpu(devices=2)
def test_ring_attention_over_nccl_equals_one_process():
    res = run_ranks(ring_attention_nccl, 2, [3, 5], backend="cpu:gloo,cuda:nccl", timeout=300)
    for rank, r in enumerate(res):
        assert r["ungrouped"] == 0 and r["grouped"] > 0, (rank, r)
        assert r["out"] < 1e-4 and r["dq"] < 1e-4, (rank, r)  # fp32 fused kernel vs SDPA
