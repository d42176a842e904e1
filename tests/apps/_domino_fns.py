"""Rank function: DoMINO trained on shards of a run store vs the same training on one process."""

from __future__ import annotations

import torch


def train_both(rank, world_size, store, grid_layout, steps, form="shardtensor"):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.apps.domino_train import domino_sample, make_domino, train_domino
    from meshshard.models.domino import LocalOps
    from meshshard.ops.domino_ops import ShardedDominoOps

    def f64(s):
        return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in s.items()}

    mesh = init_device_mesh("cpu", (world_size,))
    solo = dist.new_group([0])
    s = f64(domino_sample(store, rank, world_size, mesh.get_group(0), grid_shape=(6, 4, 4),
                          grid_layout=grid_layout))
    m = make_domino(s["layout"], s["target"].shape[1], ShardedDominoOps(mesh, s["layout"].sizes),
                    hidden=8).double()
    if form == "shardtensor":  # ShardTensor inputs and loss, a plain backward
        losses = train_domino([s], m, steps=steps, lr=1e-3, mesh=mesh)
    else:  # local tensors, allreduce_grads
        losses = train_domino([s], m, steps=steps, lr=1e-3, group=mesh.get_group(0))
    out = {"losses": losses}
    if rank == 0:
        r = f64(domino_sample(store, 0, 1, solo, grid_shape=(6, 4, 4)))
        m1 = make_domino(r["layout"], r["target"].shape[1], LocalOps(), hidden=8).double()
        out["single"] = train_domino([r], m1, steps=steps, lr=1e-3, sharded=False)
        out["params"] = (torch.cat([p.detach().reshape(-1) for p in m.parameters()]),
                         torch.cat([p.detach().reshape(-1) for p in m1.parameters()]))
    dist.barrier()
    return out
