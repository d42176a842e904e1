"""Rank functions: DDP / FSDP2 over "data" with ShardTensor inputs over "domain", vs one
process."""

from __future__ import annotations

import torch

# two samples, one per data group, each cut unevenly over the 2 domain ranks
SIZES = ((3, 5), (1, 6))


def model(seed: int = 0, hidden: int = 16, layers: int = 2):
    from meshshard.models import Transolver

    torch.manual_seed(seed)
    return Transolver(3, 2, 2, n_hidden=hidden, n_layers=layers, heads=2, slices=4)


def samples():
    g = torch.Generator().manual_seed(1)
    return [tuple(torch.randn(1, sum(s), d, generator=g) for d in (3, 2, 2)) for s in SIZES]


def shard(mesh, sample, sizes):
    from meshshard.shardtensor import Shard, from_local

    pc = mesh.get_local_rank("domain")
    off = sum(sizes[:pc])
    sl = slice(off, off + sizes[pc])
    return tuple(from_local(a[:, sl], mesh["domain"], [Shard(1)], sizes) for a in sample)


def mse(m, c, f, t):
    return ((m(c, f) - t) ** 2).mean()


def reference(steps: int, lr: float = 1e-2, data: list | None = None):
    """One process: the mean of the per-sample losses, Adam."""
    ref = model()
    opt = torch.optim.Adam(ref.parameters(), lr=lr)
    data = data if data is not None else samples()
    outs = [ref(c, f).detach() for c, f, _ in data]
    losses, grads = [], None
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(mse(ref, *s) for s in data) / len(data)
        loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
        losses.append(loss.item())
        opt.step()
    return ref, outs, grads, losses


def full_params(m) -> dict:
    """name -> full parameter (DTensor params gathered; DDP's "module." prefix dropped)."""
    out = {}
    for n, p in m.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[n.removeprefix("module.")] = t.clone()
    return out


def full_grads(m) -> dict:
    out = {}
    for n, p in m.named_parameters():
        g = p.grad
        if hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[n.removeprefix("module.")] = g.clone()
    return out


def data_parallel_run(rank, world_size, mode, shard_dims, steps, extra=None, inplace=False):
    """2x2 mesh; each data group trains on its own sample with ``mode`` over "data"; ``inplace``
    scales the model's output in place before the loss (FSDP2 drops its pre-backward hook
    when that output is a view)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.parallel import data_parallel

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "domain"))
    d = mesh.get_local_rank("data")
    data = samples()
    c, f, t = shard(mesh, data[d], SIZES[d])
    inner = model()
    m = data_parallel(inner, mesh, mode=mode, shard_dims=shard_dims, **(extra or {}))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    out = m(c, f)
    report = {"out": out.full_tensor().detach(), "group": d}
    losses, grads = [], None
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            opt.zero_grad()
            if inplace:
                loss = ((m(c, f).mul_(1.0) - t) ** 2).mean()
            else:
                loss = mse(m, c, f, t)
            loss.backward()
            if grads is None:
                grads = full_grads(m)
            # the loss of the whole batch (mean over data groups), for the comparison
            lt = torch.tensor([loss.item()])
            torch.distributed.all_reduce(lt, group=mesh.get_group("data"))
            losses.append(lt.item() / 2)
            opt.step()
    report.update(grads=grads, losses=losses, weights=full_params(m),
                  view_warnings=[str(w.message)[:120] for w in caught
                                 if "view tensor" in str(w.message)])  # fmt: skip
    return report


def bad_inputs(rank, world_size):
    """Unknown mode / mesh dim raise at once; weights that differ on one rank raise on all."""
    import pytest
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.parallel import data_parallel

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "domain"))
    with pytest.raises(ValueError, match="mode='zero' must be one of"):
        data_parallel(model(), mesh, mode="zero")
    with pytest.raises(ValueError, match="data_dim='batch' is not a dim of the mesh"):
        data_parallel(model(), mesh, data_dim="batch")
    with pytest.raises(ValueError, match=r"mesh dims \['tensor'\] not in the mesh"):
        data_parallel(model(), mesh, mode="fsdp", shard_dims=("data", "tensor"))
    with pytest.raises(ValueError, match="use static_graph=True|Use static_graph=True"):
        data_parallel(model(), mesh, mode="ddp", find_unused_parameters=True)
    data_parallel(model(seed=1 if rank == 3 else 0), mesh, mode="fsdp")


def bucket_guard(rank, world_size):
    """``meshshard.apps.train`` buckets the weight gradients only without a DDP/FSDP wrapper."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from meshshard.apps.train import _can_bucket

    plain, ddp, fsdp = model(), DistributedDataParallel(model()), model()
    fully_shard(fsdp.blocks[0])
    return _can_bucket(plain), _can_bucket(ddp), _can_bucket(fsdp)
