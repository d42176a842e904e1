"""A point transformer (global attention over all points + cross-attention from probe points),
unmodified, domain-parallel on ShardTensors: exact ring attention on uneven shards.

    torchrun --standalone --nproc-per-node 2 examples/point_transformer.py [--device cuda]
"""

import argparse
import copy

import torch
from torch.distributed.device_mesh import init_device_mesh

from meshshard.comm import default_device, init, shutdown
from meshshard.models import PointTransformer
from meshshard.shardtensor import Shard, from_local

ap = argparse.ArgumentParser(description="point transformer on shards")
ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
device = torch.device(ap.parse_args().device or default_device())
rank, world = init("gloo" if device.type == "cpu" else None)  # cuda: cpu:gloo,cuda:nccl
if device.type == "cuda":
    device = default_device()  # this rank's GPU
mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("domain",))

g = torch.Generator().manual_seed(0)
points = torch.randn(1, 3000, 4, generator=g).to(device)  # (x, y, z, feature); same everywhere
probes = torch.randn(1, 500, 3, generator=g).to(device)   # query points, e.g. on a surface


def uneven(n):                                   # shares 1 : 2 : ... : world
    sizes = [n * (r + 1) // (world * (world + 1) // 2) for r in range(world)]
    sizes[-1] += n - sum(sizes)
    return sizes


def mine(t, sizes):                              # this rank's rows as a ShardTensor
    off = sum(sizes[:rank])
    return from_local(t[:, off : off + sizes[rank]], mesh, [Shard(1)], sizes)


torch.manual_seed(0)
model = PointTransformer(in_dim=4, out_dim=2, dim=32, heads=4, depth=2, query_dim=3).to(device)
ref = copy.deepcopy(model)                       # the same model in one process, for the check

out = model(mine(points, uneven(3000)), mine(probes, uneven(500)))   # ring attention inside
(out**2).mean().backward()
(ref(points, probes) ** 2).mean().backward()
same = all(torch.allclose(p.grad, r.grad, rtol=1e-4, atol=1e-6)
           for p, r in zip(model.parameters(), ref.parameters()))
print(f"rank {rank}: {out.to_local().shape[1]} of {out.shape[1]} probe outputs; "
      f"gradients equal a single-process run: {same}", flush=True)
shutdown(exit_code=0)
