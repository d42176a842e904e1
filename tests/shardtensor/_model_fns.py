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


def adam_steps(model, ref, loss, loss_ref, steps: int) -> list:
    """``steps`` Adam steps (lr 1e-2) of ``model`` and of the one-process ``ref`` from the
    gradients they hold, each followed by ``loss()`` / ``loss_ref()`` and their backward:
    [(loss, one-process loss)] per step."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()
        got, want = loss(), loss_ref()
        got.backward()
        want.backward()
        losses.append((got.item(), want.item()))
    return losses


def assert_trains_like_one_process(rep: dict, rank: int) -> None:
    """A Transolver report equals one process's: output, loss, every parameter gradient and,
    where the report has them, the losses and weights after Adam steps. fp32: rtol 1e-5, plus
    1e-5 of each tensor's scale and 1e-7 for entries near zero (summation order differs)."""
    import pytest

    from tests.shardtensor._oracle import close

    def _close(a, b, what):
        close(a, b, f"rank {rank} {what}", 1e-5, floor=1e-7)

    _close(*rep["out"], "output")
    _close(*rep["loss"], "loss")
    assert len(rep["grads"]) > 20
    for name, (g, g_ref) in rep["grads"].items():
        _close(g, g_ref, f"grad {name}")
    for a, b in rep.get("losses", ()):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7)
    for name, (w, w_ref) in rep.get("weights", {}).items():
        _close(w, w_ref, f"weight {name} after Adam steps")


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
    report["losses"] = adam_steps(model, ref, lambda: ((model(c, f) - t) ** 2).mean(),
                                  lambda: ((ref(coords, feats) - target) ** 2).mean(), steps)
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
