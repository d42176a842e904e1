"""Rank functions for ``test_on_shardtensors.py``: the neighbour ops on ShardTensors
(autograd on the wrapper), against scipy / one process on the gathered data (fp64)."""

from __future__ import annotations

import numpy as np
import torch
from torch.distributed.tensor import Shard


def cases(rank: int, world: int, sizes: tuple, k: int) -> dict:
    from scipy.spatial import cKDTree
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard import ops
    from meshshard.shardtensor._aten import ShardTensor, from_local

    mesh = init_device_mesh("cpu", (world,))
    n = sum(sizes)
    g = torch.Generator().manual_seed(n * 3 + world)
    X = torch.rand(n, 3, generator=g, dtype=torch.float64)
    W = torch.randn(n, k, generator=g, dtype=torch.float64)
    off = sum(sizes[:rank])
    x = from_local(X[off : off + sizes[rank]].clone(), mesh, [Shard(0)], [sizes]).detach() \
        .requires_grad_()
    d, idx = ops.knn(x, k, loop=False)
    out = {"classes": (type(d) is ShardTensor and type(idx) is ShardTensor)}
    ref_d, ref_i = cKDTree(X.numpy()).query(X.numpy(), k + 1)
    out["index"] = (idx.full_tensor(), torch.from_numpy(ref_i[:, 1:]))
    out["dist"] = (d.full_tensor().detach(), torch.from_numpy(ref_d[:, 1:]))
    # distances are differentiable w.r.t. the sharded points: d/dx sum(W * d)
    gx, = torch.autograd.grad((d * from_local(W[off : off + sizes[rank]], mesh, [Shard(0)],
                                             [sizes])).sum(), x)
    Xr = X.clone().requires_grad_()
    ri = torch.from_numpy(ref_i[:, 1:])
    dr = (Xr[:, None, :] - Xr[ri]).norm(dim=-1)
    out["grad"] = (gx.full_tensor(), torch.autograd.grad((W * dr).sum(), Xr)[0])
    # rows at global indices (one ring of neighbours), and their gradient
    feats = from_local((X[off : off + sizes[rank]] * 2).clone(), mesh, [Shard(0)], [sizes]) \
        .detach().requires_grad_()
    rows = ops.gather_neighbors(feats, idx)
    out["gathered"] = (rows.full_tensor().detach(), (X * 2)[ri])
    gf, = torch.autograd.grad(rows.sum(), feats)
    counts = torch.from_numpy(np.bincount(ref_i[:, 1:].ravel(), minlength=n)).double()
    out["gather grad"] = (gf.full_tensor(), counts[:, None].expand(n, 3))
    return out


def compiled_cases(rank: int, world: int, layouts: list) -> list:
    """A compiled function that computes on the points, queries kNN and radius neighbours and
    uses the distances: Dynamo's graph breaks (one per neighbour query), and the value and the
    points' gradient against the same function run eagerly, for each layout (fp64)."""
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard import ops
    from meshshard.shardtensor import from_local

    mesh = init_device_mesh("cpu", (world,))
    torch.set_default_dtype(torch.float64)

    def f(x):
        h = x * 2 + 1
        d, _ = ops.knn(h, 2, loop=False)
        rd, ri = ops.radius(h, 0.8, max_num_neighbors=4)
        rd = torch.where(ri >= 0, rd, 0.0)  # padding: inf / -1
        return (d.sum(1, keepdim=True) * h).sum() + (rd.sum(1, keepdim=True) * h.sin()).sum()

    out = []
    for sizes in layouts:
        n = sum(sizes)
        X = torch.rand(n, 3, generator=torch.Generator().manual_seed(n))
        off = sum(sizes[:rank])

        def point(X=X, off=off, sizes=sizes):
            return from_local(X[off : off + sizes[rank]].clone(), mesh, [Shard(0)], [sizes]) \
                .requires_grad_()

        torch._dynamo.reset()
        counters.clear()
        x, xe = point(), point()
        got = torch.compile(f, backend="aot_eager")(x)
        breaks = sum(counters["graph_break"].values())
        want = f(xe)
        gx, = torch.autograd.grad(got, x)
        gxe, = torch.autograd.grad(want, xe)
        out.append({"breaks": breaks, "value": (got.detach().full_tensor(),
                                                want.detach().full_tensor()),
                    "grad": (gx.full_tensor(), gxe.full_tensor())})
    return out
