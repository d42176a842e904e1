"""Rank function: the reference PointTransformer on ShardTensors vs one process."""

from __future__ import annotations

import traceback

import torch

TOL = {torch.float64: (1e-10, 1e-12), torch.float32: (1e-5, 1e-6)}


def _split(full, sizes, rank):
    off = sum(sizes[:rank])
    return full[:, off : off + sizes[rank]]


def _case(c, rank, mesh):
    from meshshard.models import PointTransformer
    from meshshard.shardtensor import Replicate, Shard, ShardTensor, from_local

    dt = c.get("dtype", torch.float64)
    xs, qs = c["x"], c.get("q")
    N = sum(xs)
    M = c.get("M", sum(qs) if qs else None)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, N, 4, generator=g, dtype=dt)
    qp = None if M is None else torch.randn(1, M, 3, generator=g, dtype=dt)
    t = torch.randn(1, M or N, 2, generator=g, dtype=dt)
    kpm = None
    if c.get("kpm"):
        kpm = torch.rand(1, N, generator=g) < 0.3
        kpm[:, 0] = False  # one visible point at least
    kw = {"dim": 16, "heads": 4, "depth": 2, "query_dim": None if M is None else 3,
          "causal": c.get("causal", False)}
    torch.manual_seed(0)
    ref = PointTransformer(4, 2, **kw).to(dt)
    torch.manual_seed(0)
    model = PointTransformer(4, 2, **kw).to(dt)

    def shard(a, sizes):
        if sizes is None:
            return from_local(a, mesh, [Replicate()])
        return from_local(_split(a, sizes, rank).clone(), mesh, [Shard(1)], sizes)

    xd = shard(x, xs)
    qd = None if qp is None else shard(qp, qs)
    td = shard(t, qs if M is not None else xs)
    kd = None if kpm is None else shard(kpm, xs)
    rtol, atol = TOL[dt]
    # SGD with momentum: Adam divides by sqrt(v) and so blows rounding noise up to O(lr) on
    # gradients that are zero in exact arithmetic (the key bias of softmax attention)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(c.get("steps", 3)):
        out = model(xd, qd, kd)
        out_ref = ref(x, qp, kpm)
        assert isinstance(out, ShardTensor)
        torch.testing.assert_close(out.full_tensor().detach(), out_ref.detach(), rtol=rtol,
                                   atol=atol, msg=lambda m, s=step: f"step {s} output: {m}")
        loss = ((out - td) ** 2).mean()
        loss_ref = ((out_ref - t) ** 2).mean()
        loss.backward()
        loss_ref.backward()
        for (n, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad, r.grad, rtol=rtol, atol=atol,
                                       msg=lambda m, n=n, s=step: f"step {s} grad {n}: {m}")
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()
    for (n, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.detach(), r.detach(), rtol=rtol, atol=atol,
                                   msg=lambda m, n=n: f"weight {n} after SGD steps: {m}")


def point_transformer_cases(rank, world_size, cases):
    """{case index: None | traceback}."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    out = {}
    for i, c in enumerate(cases):
        try:
            _case(c, rank, mesh)
            out[i] = None
        except Exception:
            out[i] = traceback.format_exc()
    return out
