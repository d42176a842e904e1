"""Rank functions for ``test_sync_counts.py``: host syncs per neighbour-op call on ShardTensors
(forward and backward), counted by :mod:`meshshard.testing.sync_census`."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Shard


def op_syncs(rank: int, world: int, sizes: list[int], opts: dict | None = None) -> dict:
    """``{op: (total, report)}`` for one warm call of each op (a first call warms caches)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard import ops
    from meshshard.shardtensor import from_local
    from meshshard.testing.sync_census import sync_census

    opts = opts or {}
    mesh = init_device_mesh("cpu", (world,))
    n = sum(sizes)
    g = torch.Generator().manual_seed(n)
    X = torch.rand(n, 3, generator=g, dtype=torch.float64)
    F = torch.rand(n, 4, generator=g, dtype=torch.float64)
    off = sum(sizes[:rank])

    def st(t, req=True):
        out = from_local(t[off : off + sizes[rank]].clone(), mesh, [Shard(0)], [sizes])
        return out.detach().requires_grad_(req)

    kb = opts.get("backend", "auto")
    idx = ops.knn(st(X, False), 6, loop=False)[1]
    ones = from_local(torch.ones(sizes[rank], 6, 4, dtype=torch.float64), mesh, [Shard(0)],
                      [sizes])
    like = st(F, False)

    def knn(x):
        d, _ = ops.knn(x, 6, loop=False, backend=kb)
        d.sum().backward()

    def radius(x):
        d, i = ops.radius(x, 0.2, max_num_neighbors=opts.get("max_neighbors"), backend=kb)
        torch.where(i >= 0, d, 0.0).sum().backward()

    def radius_static(x):
        d, i = ops.radius(x, 0.2, max_num_neighbors=16, backend=kb)
        torch.where(i >= 0, d, 0.0).sum().backward()

    from meshshard.ops.halo import halo_exchange
    from tests.ops._data import knn_halo_plan

    plan = knn_halo_plan(X.numpy(), sizes)

    def halo(f):  # a layer's ghost refresh (the entry check off): the plan's rows are cached
        halo_exchange(f.to_local(), plan, check=False).sum().backward()

    def gather(f):
        ops.gather_neighbors(f, idx).sum().backward()

    def scatter(v):
        ops.scatter_to_owners(v, idx, like=like).sum().backward()

    out = {}
    for name, fn, src in (("knn", knn, X), ("radius", radius, X),
                          ("radius_static", radius_static, X), ("gather", gather, F),
                          ("halo", halo, F),
                          ("scatter", scatter, None)):
        if "ops" in opts and name not in opts["ops"]:
            continue
        for warm in (True, False):
            arg = st(src) if src is not None else ones.detach().requires_grad_()
            if warm:
                fn(arg)
                continue
            with sync_census() as c:
                fn(arg)
        out[name] = (c.total, c.report())
    return out
