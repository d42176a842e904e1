"""meshshard in one page: cut a point cloud, shard it, query neighbours, train a step.

    torchrun --standalone --nproc-per-node 2 examples/quickstart.py [--device cuda]
"""

import argparse

import numpy as np
import torch
from torch.distributed.device_mesh import init_device_mesh

from meshshard import ops
from meshshard.comm import default_device, init, shutdown
from meshshard.models import Transolver
from meshshard.partition import knn_graph, metrics, partition
from meshshard.shardtensor import Shard, from_local

torch.manual_seed(0)  # same model weights on every rank and every run: a reproducible loss
ap = argparse.ArgumentParser(description="meshshard in one page")
ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
device = torch.device(ap.parse_args().device or default_device())
# collectives fail after MESHSHARD_TIMEOUT s (default 5 min); on CUDA: cpu:gloo,cuda:nccl
rank, world = init("gloo" if device.type == "cpu" else None)
if device.type == "cuda":
    device = default_device()  # this rank's GPU
mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("domain",))

# 1. every rank cuts the same cloud the same way (deterministic); shards are uneven on purpose
pts = np.random.default_rng(0).random((20_000, 3)).astype(np.float32)
shares = np.arange(1, world + 1, dtype=float)
part = partition(pts, world, method="rcb", targets=shares / shares.sum())
if rank == 0:
    m = metrics(part, graph=knn_graph(pts, 8))
    print(f"sizes {part.sizes.tolist()}  edge cut {m['edge_cut']}  halo {m['halo_volume']}")

# 2. this rank's rows (stored in partition order) as a ShardTensor that knows every rank's size
mine = torch.from_numpy(part.split(part.apply(pts))[rank]).to(device)
x = from_local(mine, mesh, [Shard(0)], sharding_shapes=part.sizes.tolist())

# 3. exact kNN over all ranks (moves only queries that cross a cut), differentiable distances
d, idx = ops.knn(x, 8, loop=False)
print(f"rank {rank}: {x.to_local().shape[0]} points, mean 8-NN distance {d.mean().item():.4f}")

# 4. an unmodified Transolver trains on the shards; the loss is a true global mean
model = Transolver(space_dim=3, fun_dim=1, out_dim=1, n_hidden=16, n_layers=1, heads=2,
                   slices=8).to(device)
feat = torch.log(d.mean(dim=1, keepdim=True))
target = torch.sin(4 * x[:, :1])
loss = ((model(x.unsqueeze(0), feat.unsqueeze(0)) - target.unsqueeze(0)) ** 2).mean()
loss.backward()
value = loss.item()  # the loss is Partial (a sum of per-rank terms): .item() is collective
if rank == 0:
    print(f"loss {value:.4f}; weight gradients equal a single-device run")
shutdown(exit_code=0)  # groups torn down in order, then exit (skips a torch 2.13 gloo abort)
