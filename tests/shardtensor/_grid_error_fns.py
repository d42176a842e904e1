"""Rank function: bad input to the grid rules raises a clear error on every rank (no hang)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bad_inputs(rank, world_size, sizes):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    from meshshard.shardtensor import Replicate, Shard, from_local
    from meshshard.shardtensor.grid import count_halo_bytes, halo_limit

    mesh = init_device_mesh("cpu", (world_size,))
    other = DeviceMesh("cpu", torch.arange(world_size).flip(0))
    n = sum(sizes)
    off = sum(sizes[:rank])
    full = torch.randn(1, 2, n, 6, generator=torch.Generator().manual_seed(0))
    x = from_local(full[:, :, off : off + sizes[rank]].clone(), mesh, [Shard(2)], sizes)
    xc = from_local(torch.randn(1, 1, n, 6), mesh, [Shard(1)], [1] * world_size)
    wt = torch.randn(3, 2, 5, 5)
    w_other = from_local(wt, other, [Replicate()])

    def halo_far():
        with halo_limit(1):
            return F.conv2d(x, wt, padding=2)

    cases = {
        "halo_beyond_neighbours": halo_far,
        "conv_channel_sharded": lambda: F.conv2d(xc, torch.randn(3, world_size, 3, 3)),
        "mismatched_meshes": lambda: F.conv2d(x, w_other, padding=2),
        "reflect_pad_too_large": lambda: F.pad(x, (0, 0, n, n), mode="reflect"),
        "circular_pad_wraps_twice": lambda: F.pad(x, (0, 0, n + 1, 0), mode="circular"),
        "negative_pad_too_large": lambda: F.pad(x, (0, 0, -n, -1)),
        "adaptive_not_dividing": lambda: F.adaptive_avg_pool2d(x, (n - 1, 3)),
        "interpolate_bicubic": lambda: F.interpolate(x, scale_factor=2, mode="bicubic"),
        "kernel_larger_than_grid": lambda: F.conv2d(x, torch.randn(3, 2, n + 1, 3)),
        "conv_channels_mismatch": lambda: F.conv2d(x, torch.randn(3, 3, 3, 3)),
        "pool_larger_than_grid": lambda: F.max_pool2d(x, (n + 1, 1)),
        "pool_pad_too_large": lambda: F.avg_pool2d(x, 3, padding=2),
    }
    out = {}
    for name, fn in cases.items():
        try:
            fn()
            out[name] = None
        except Exception as exc:  # the test checks the type and message
            # every class it is (NoShardingRuleError is also a NotImplementedError)
            out[name] = ([c.__name__ for c in type(exc).__mro__], str(exc))
        # every rank is still in step: a collective after each case completes
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == world_size
    # and the limit is only a limit: without it the same conv is exact
    ref = F.conv2d(full, wt, padding=2)
    got = F.conv2d(x, wt, padding=2).full_tensor()
    out["no_limit_exact"] = bool(torch.allclose(got, ref, atol=1e-5))
    # max pooling's indices (an error in design A) are one process's: flat over the global grid
    got, idx = F.max_pool2d(x, 2, return_indices=True)
    want, want_idx = F.max_pool2d(full, 2, return_indices=True)
    out["max_pool_indices"] = (got.full_tensor(), want, idx.full_tensor(), want_idx)
    # halo traffic of a 3x3 conv: exactly the boundary rows that cross a cut, both directions
    xg = from_local(full[:, :, off : off + sizes[rank]].clone().requires_grad_(), mesh,
                    [Shard(2)], sizes)
    with count_halo_bytes() as stats:
        F.conv2d(xg, torch.randn(3, 2, 3, 3), padding=1).full_tensor().sum().backward()
    out["halo_bytes"] = (stats.forward, stats.backward)
    return out
