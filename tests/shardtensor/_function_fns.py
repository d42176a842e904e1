"""Rank functions: custom torch.autograd.Functions and tensor hooks on ShardTensors."""

from __future__ import annotations

import torch


class ScaledSquare(torch.autograd.Function):
    """y = scale * x * w (x sharded, w plain) with a hand-written backward using
    save_for_backward, needs_input_grad and a non-tensor argument."""

    @staticmethod
    def forward(ctx, x, w, scale):
        ctx.save_for_backward(x, w)
        ctx.scale = scale
        return scale * x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g * w * ctx.scale if ctx.needs_input_grad[0] else None
        gw = (g * x).sum(dim=(0, 1)) * ctx.scale if ctx.needs_input_grad[1] else None
        return gx, gw, None


class SplitSum(torch.autograd.Function):
    """Two outputs, setup_context style: (x + 1, x.sum(-1, keepdim=True))."""

    @staticmethod
    def forward(x):
        return x + 1, x.sum(-1, keepdim=True)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.shape = inputs[0].shape

    @staticmethod
    def backward(ctx, ga, gb):
        return ga + gb.expand(ctx.shape)


class BadBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return torch.ones(g.shape)  # a plain, global-shaped tensor for a ShardTensor input


def _loss(x, w, hook_calls=None):
    y = ScaledSquare.apply(x, w, 3.0)
    a, b = SplitSum.apply(torch.tanh(y))
    if hook_calls is not None and a.requires_grad:
        a.register_hook(lambda g: hook_calls.append(type(g).__name__) or g * 2)
    return (a**2).mean() + (b * x).mean()


def functions_vs_single(rank, world_size, sizes):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("domain",))
    g = torch.Generator().manual_seed(0)
    x_full = torch.randn(1, sum(sizes), 4, generator=g)
    w_full = torch.randn(4, generator=g)
    off = sum(sizes[:rank])
    x_loc = x_full[:, off : off + sizes[rank]].clone().requires_grad_(True)
    w = w_full.clone().requires_grad_(True)
    x = from_local(x_loc, mesh, [Shard(1)], sizes)
    calls: list = []
    loss = _loss(x, w, calls)
    loss.backward()
    xr, wr = x_full.clone().requires_grad_(True), w_full.clone().requires_grad_(True)
    ref_calls: list = []
    loss_ref = _loss(xr, wr, ref_calls)
    loss_ref.backward()
    out = {
        "loss": (loss.item(), loss_ref.item()),
        "gx": (x_loc.grad, xr.grad[:, off : off + sizes[rank]]),
        "gw": (w.grad, wr.grad),
        "hook": calls,
    }
    try:
        BadBackward.apply(x).sum().backward()
    except TypeError as exc:
        out["bad"] = str(exc)
    return out
