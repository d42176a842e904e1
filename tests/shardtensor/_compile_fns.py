"""Rank functions: compiled (torch.compile, compile_local) vs eager ShardTensor vs one process."""

from __future__ import annotations

import torch
from torch import nn


def _mesh(world_size):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world_size,), mesh_dim_names=("domain",))


def _shard(tensors, mesh, sizes, rank):
    from meshshard.shardtensor import Shard, from_local

    off = sum(sizes[:rank])
    sl = slice(off, off + sizes[rank])
    return [from_local(a[:, sl].clone(), mesh, [Shard(1)], sizes) for a in tensors]


def _data(N, dims=(3, 2, 2), seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, N, d, generator=g) for d in dims]


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 2))


def _step(model, inputs, target):
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    loss = ((out - target) ** 2).mean()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out, loss, grads


def _full(t):
    from meshshard.shardtensor import ShardTensor

    return t.full_tensor().detach() if isinstance(t, ShardTensor) else t.detach()


def mlp_local(rank, world_size, layouts, backend):
    """compile_local on an MLP: per layout, output/loss/grads of eager ShardTensor, compiled
    ShardTensor and one process (the same compiled module serves every layout)."""
    from meshshard.shardtensor.compile import compile_local

    mesh = _mesh(world_size)
    ref, eager, comp = _mlp(), _mlp(), _mlp()
    compile_local(comp, backend=backend)
    reports = []
    for sizes in layouts:
        c, f, t = _data(sum(sizes))
        x = torch.cat([c, f], dim=-1)
        sx, st = _shard([x, t], mesh, sizes, rank)
        rep = {}
        for name, model, inp, tgt in (("ref", ref, [x], t), ("eager", eager, [sx], st),
                                      ("compiled", comp, [sx], st)):
            out, loss, grads = _step(model, inp, tgt)
            rep[name] = (_full(out), float(loss.detach()), grads)
        reports.append(rep)
    return reports
