"""A dim of global size 1 sharded over a mesh dim of size 1 (a batch of one on a data axis of
one, as on a 1 x domain x tensor mesh) survives reshapes that keep it."""

import torch

from meshshard.testing import run_ranks


def reshape_batch_of_one(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("data", "domain"))
    sizes = (3, 5)
    full = torch.randn(1, 8, 6, generator=torch.Generator().manual_seed(0))
    off = sum(sizes[:rank])
    local = full[:, off : off + sizes[rank]].clone().requires_grad_(True)
    x = from_local(local, mesh, [Shard(0), Shard(1)], {0: (1,), 1: sizes})
    y = x.reshape(1, 8, 2, 3)
    back = y.permute(0, 2, 1, 3).permute(0, 2, 1, 3).reshape(1, 8, 6)
    (back * 2).sum().backward()
    return {"placements": tuple(str(p) for p in y.placements), "sizes": y.spec.sizes,
            "y": (y.full_tensor(), full.reshape(1, 8, 2, 3)),
            "back": (back.full_tensor(), full), "grad": local.grad}


def test_reshape_keeps_a_size_one_sharded_dim():
    for rep in run_ranks(reshape_batch_of_one, 2, timeout=60):
        assert rep["placements"] == ("S(0)", "S(1)")
        assert rep["sizes"] == ((1,), (3, 5))
        torch.testing.assert_close(*rep["y"])
        torch.testing.assert_close(*rep["back"])
        torch.testing.assert_close(rep["grad"], torch.full_like(rep["grad"], 2.0))
