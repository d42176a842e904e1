"""Rank functions: a compiled model's ShardTensor output used by eager code whose backward gives
it a gradient in another layout than the traced one (``out.sum()``: a Replicate expand), against
one process (fp64)."""

from __future__ import annotations

import torch

LOSSES = {
    "sum": lambda out: out.sum(),  # gradient: a Replicate scalar expanded
    "column mean": lambda out: out[..., :1].mean(),  # Replicate, then sliced back
    "full": lambda out: (out.full_tensor() ** 2).sum(),  # plain full gradient, cut
    "elementwise": lambda out: ((out - 0.5) ** 2).mean(),  # same layout already
}


def compiled_losses(rank: int, world: int, sizes: tuple) -> dict:
    """The Transolver compiled (aot_eager) on points split ``sizes``; for each loss of
    :data:`LOSSES` (computed eagerly on the output), the points' and every weight's gradient
    and the loss, with the same model on all points in one process; then the same gradients
    for a Replicate gradient given to ``backward`` and to ``autograd.grad``."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.shardtensor import Replicate, Shard, from_local

    mesh = init_device_mesh("cpu", (world,))
    torch.set_default_dtype(torch.float64)
    torch._dynamo.reset()
    n = sum(sizes)
    g = torch.Generator().manual_seed(n)
    full = [torch.randn(1, n, d, generator=g) for d in (3, 2)]
    off = sum(sizes[:rank])
    torch.manual_seed(0)
    model = Transolver(3, 2, 2, n_hidden=16, n_layers=2, heads=2, slices=4)
    torch.manual_seed(0)
    ref = Transolver(3, 2, 2, n_hidden=16, n_layers=2, heads=2, slices=4)
    fwd = torch.compile(model, backend="aot_eager")
    out = {}
    for name, loss_of in LOSSES.items():
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        xl = full[0][:, off:off + sizes[rank]].clone().requires_grad_(True)
        c = from_local(xl, mesh, [Shard(1)], sizes)
        f = from_local(full[1][:, off:off + sizes[rank]].clone(), mesh, [Shard(1)], sizes)
        loss = loss_of(fwd(c, f))
        loss.backward()
        xr = full[0].clone().requires_grad_(True)
        lr = loss_of_plain(name, ref(xr, full[1]))
        lr.backward()
        got = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        pairs = [(got.detach(), lr.detach()), (xl.grad, xr.grad[:, off:off + sizes[rank]])]
        pairs += [(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters())]
        out[name] = pairs
    # a gradient given for the output, Replicate: backward(gradient) and autograd.grad
    G = torch.randn(1, n, 2, generator=g)
    xr = full[0].clone().requires_grad_(True)
    ref.zero_grad(set_to_none=True)
    ref(xr, full[1]).backward(G)
    want = [xr.grad[:, off:off + sizes[rank]]] + [q.grad for q in ref.parameters()]
    for how in ("backward(gradient)", "autograd.grad(grad_outputs)"):
        model.zero_grad(set_to_none=True)
        xl = full[0][:, off:off + sizes[rank]].clone().requires_grad_(True)
        c = from_local(xl, mesh, [Shard(1)], sizes)
        f = from_local(full[1][:, off:off + sizes[rank]].clone(), mesh, [Shard(1)], sizes)
        o = fwd(c, f)
        gr = from_local(G.clone(), mesh, [Replicate()])
        if how.startswith("backward"):
            o.backward(gr)
            got = [xl.grad] + [q.grad for q in model.parameters()]
        else:
            got = list(torch.autograd.grad(o, [xl, *model.parameters()], grad_outputs=gr))
        out[how] = list(zip(got, want))
    return out


def loss_of_plain(name: str, out: torch.Tensor) -> torch.Tensor:
    if name == "full":
        return (out**2).sum()
    return LOSSES[name](out)
