"""Where no rank needs another rank's rows (pool 2/2 or a 1x1 conv on even slabs, an empty
shard), the grid rules skip the all-to-all on every rank -- and still equal one process --
while a 3x3 conv exchanges once per call."""

import torch

from meshshard.testing import run_ranks


def _count(rank, world_size, sizes):
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local
    from meshshard.shardtensor.grid import count_halo_bytes

    mesh = init_device_mesh("cpu", (world_size,))
    full = torch.randn(1, 2, sum(sizes), 4, 4, generator=torch.Generator().manual_seed(0))
    off = sum(sizes[:rank])
    leaf = full[:, :, off : off + sizes[rank]].clone().requires_grad_(True)
    x = from_local(leaf, mesh, [Shard(2)], sizes)
    w1 = torch.randn(3, 2, 1, 1, 1, generator=torch.Generator().manual_seed(1))
    w3 = torch.randn(3, 2, 3, 3, 3, generator=torch.Generator().manual_seed(2))
    out = {}
    for name, f in (("pool", lambda t: F.max_pool3d(t, 2)),
                    ("conv1x1", lambda t: F.conv3d(t, w1)),
                    ("conv3x3", lambda t: F.conv3d(t, w3, padding=1))):
        with count_halo_bytes() as stats:
            y = f(x)
            y.full_tensor().sum().backward()
        ref = f(full)
        torch.testing.assert_close(y.full_tensor(), ref, rtol=1e-5, atol=1e-5)
        out[name] = stats.calls
    return out


def test_no_exchange_where_nothing_moves():
    for sizes in ((4, 4), (0, 8)):
        for calls in run_ranks(_count, 2, sizes, timeout=120):
            assert calls["pool"] == 0
            assert calls["conv1x1"] == 0
            assert calls["conv3x3"] == (1 if sizes == (4, 4) else 0)
