"""Rank functions: the reference Transolver on ShardTensors vs one process."""

from __future__ import annotations

import torch


def _model(seed=0):
    from meshshard.models import Transolver

    torch.manual_seed(seed)
    return Transolver(3, 2, 2, n_hidden=16, n_layers=2, heads=2, slices=8)


def _data(B, N, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, 3, generator=g), torch.randn(B, N, 2, generator=g),
            torch.randn(B, N, 2, generator=g))


def transolver_1d(rank, world_size, sizes, steps):
    """Forward, every parameter gradient, and `steps` Adam steps vs a single process."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("domain",))
    N = sum(sizes)
    coords, feats, target = _data(1, N)
    ref, model = _model(), _model()
    off = sum(sizes[:rank])
    sl = slice(off, off + sizes[rank])
    c, f, t = (from_local(a[:, sl], mesh, [Shard(1)], sizes) for a in (coords, feats, target))
    out = model(c, f)
    out_ref = ref(coords, feats)
    report = {"out": (out.full_tensor().detach(), out_ref.detach())}
    loss = ((out - t) ** 2).mean()
    loss_ref = ((out_ref - target) ** 2).mean()
    report["loss"] = (torch.tensor(loss.item()), loss_ref.detach())
    loss.backward()
    loss_ref.backward()
    report["grads"] = {n: (p.grad.clone(), q.grad.clone()) for (n, p), (_, q) in
                       zip(model.named_parameters(), ref.named_parameters())}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()
        loss = ((model(c, f) - t) ** 2).mean()
        loss_ref = ((ref(coords, feats) - target) ** 2).mean()
        loss.backward()
        loss_ref.backward()
        losses.append((loss.item(), loss_ref.item()))
    report["losses"] = losses
    report["weights"] = {n: (p.detach().clone(), q.detach().clone()) for (n, p), (_, q) in
                         zip(model.named_parameters(), ref.named_parameters())}
    return report


def transolver_2d(rank, world_size, sizes):
    """2-D mesh (data x domain): batch sharded on "data", points on "domain" (uneven)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("data", "domain"))
    N = sum(sizes)
    coords, feats, target = _data(2, N)
    ref, model = _model(), _model()
    dc, pc = mesh.get_coordinate()
    off = sum(sizes[:pc])
    sl = slice(off, off + sizes[pc])
    shapes = {0: (1, 1), 1: sizes}
    c, f, t = (from_local(a[dc : dc + 1, sl], mesh, [Shard(0), Shard(1)], shapes)
               for a in (coords, feats, target))
    out = model(c, f)
    loss = ((out - t) ** 2).mean()
    loss.backward()
    out_ref = ref(coords, feats)
    loss_ref = ((out_ref - target) ** 2).mean()
    loss_ref.backward()
    return {
        "out": (out.full_tensor().detach(), out_ref.detach()),
        "loss": (torch.tensor(loss.item()), loss_ref.detach()),
        "grads": {n: (p.grad.clone(), q.grad.clone()) for (n, p), (_, q) in
                  zip(model.named_parameters(), ref.named_parameters())},
    }
