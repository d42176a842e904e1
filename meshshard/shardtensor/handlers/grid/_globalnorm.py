"""Fused normalisation with global statistics over sharded dims (one autograd node).

``(x - mean) * rstd * weight + bias`` where mean and variance are taken over ``dims`` of the
*global* tensor. Saves only ``x`` and the small statistics for backward (like torch's fused
batch/group norm) instead of several full-size intermediates, and recomputes ``x_hat`` in
backward, which needs two global sums (one all-reduce per sharded mesh dim).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def _allreduce(t: torch.Tensor, groups: Sequence) -> torch.Tensor:
    t = t.contiguous()
    for g in groups:
        if dist.get_world_size(g) > 1:
            dist.all_reduce(t, group=g)
    return t


class _GlobalNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dims, groups, n, eps):
        mean = _allreduce(x.sum(dims, keepdim=True), groups) / n
        var = _allreduce(((x - mean) ** 2).sum(dims, keepdim=True), groups) / n
        rstd = torch.rsqrt(var + eps)
        y = (x - mean) * rstd
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x, mean, rstd, weight)
        ctx.dims, ctx.groups, ctx.n = dims, groups, n
        ctx.bias_shape = None if bias is None else bias.shape
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, g, _gm, _gv):
        x, mean, rstd, weight = ctx.saved_tensors
        dims, n = ctx.dims, ctx.n
        xhat = (x - mean) * rstd
        dw = db = None
        if weight is not None and ctx.needs_input_grad[1]:
            dw = (g * xhat).sum_to_size(weight.shape)
        if ctx.bias_shape is not None and ctx.needs_input_grad[2]:
            db = g.sum_to_size(ctx.bias_shape)
        gy = g * weight if weight is not None else g
        sums = torch.cat([gy.sum(dims, keepdim=True), (gy * xhat).sum(dims, keepdim=True)])
        sums = _allreduce(sums, ctx.groups) / n
        k = sums.shape[0] // 2
        dx = rstd * (gy - sums[:k] - xhat * sums[k:])
        return dx, dw, db, None, None, None, None


def global_norm(
    x: torch.Tensor,
    dims: Sequence[int],
    groups: Sequence,
    n: int,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
):
    """Normalise ``x`` over ``dims`` with statistics over the global tensor (``n`` elements
    per statistic; partial sums all-reduced over ``groups``). ``weight``/``bias`` broadcast
    against ``x``. Returns ``(y, mean, biased var)``; mean/var are not differentiable.

    Collective (forward and backward): every rank of ``groups`` must call this.
    """
    return _GlobalNorm.apply(x, weight, bias, tuple(dims), tuple(groups), n, eps)
