"""Rank functions for ``test_gpu.py`` (CUDA + NCCL; skipped without GPUs)."""

from __future__ import annotations

import torch


def ring_attention_nccl(rank: int, world: int, sizes: list[int]) -> dict:
    """Ring attention on GPUs over NCCL (uneven tokens) against one process on the same GPU:
    forward, the gradient of q, the p2p census and the DeviceGuard verdict."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from meshshard.shardtensor import from_local
    from meshshard.testing.device_guard import DeviceGuard
    from meshshard.testing.p2p_census import P2PCensus

    dev = torch.device("cuda", torch.cuda.current_device())
    mesh = init_device_mesh("cuda", (world,))
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(1, 2, sum(sizes), 16, generator=g, dtype=torch.float32).to(dev)
            for _ in range(3)]
    off = sum(sizes[:rank])
    leaves = [t[:, :, off : off + sizes[rank]].clone().requires_grad_() for t in full]
    q, k, v = (from_local(t, mesh, [Shard(2)], [sizes]) for t in leaves)
    with P2PCensus() as census, DeviceGuard(dev):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
    ref = [t.clone().requires_grad_() for t in full]
    want = F.scaled_dot_product_attention(*ref, is_causal=True)
    want.sum().backward()
    return {
        "out": float((out.to_local() - want[:, :, off : off + sizes[rank]]).abs().max()),
        "dq": float((leaves[0].grad - ref[0].grad[:, :, off : off + sizes[rank]]).abs().max()),
        "ungrouped": census.ungrouped, "grouped": census.grouped,
    }
