"""Fused normalisation with global statistics over sharded dims (one autograd node).

``(x - mean) * rstd * weight + bias`` where mean and variance are taken over ``dims`` of the
*global* tensor. Saves only ``x`` and the small statistics for backward (like torch's fused
batch/group norm) instead of several full-size intermediates, and recomputes ``x_hat`` in
backward, which needs two global sums (one all-reduce per sharded mesh dim).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from meshshard.shardtensor._tracemode import reduce


def _allreduce(t: torch.Tensor, groups: Sequence) -> torch.Tensor:
    t = t.contiguous()
    for g in groups:
        if dist.get_world_size(g) > 1:
            t = reduce(t, "sum", g)
    return t


class _GlobalNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dims, groups, n, eps):
        # local mean/var in one pass, merged exactly across ranks (Chan et al.):
        # mean = sum(n_r m_r) / n; var = sum(n_r (v_r + (m_r - mean)^2)) / n
        n_loc = 1
        for d in dims:
            n_loc *= x.shape[d]
        if n_loc:
            v_loc, m_loc = _moments(x, dims)
        else:
            shape = [1 if d in dims else s for d, s in enumerate(x.shape)]
            v_loc = m_loc = x.new_zeros(shape)
        mean = _allreduce(m_loc * n_loc, groups) / n
        var = _allreduce((v_loc + (m_loc - mean) ** 2) * n_loc, groups) / n
        rstd = torch.rsqrt(var + eps)
        # y = x * a + c with per-statistic a = rstd * w, c = b - mean * a (one fused pass)
        a = rstd if weight is None else rstd * weight
        c = -mean * a
        if bias is not None:
            c = c + bias
        y = torch.addcmul(c, x, a)
        ctx.save_for_backward(x, mean, rstd, weight)
        ctx.dims, ctx.groups, ctx.n = dims, groups, n
        ctx.bias_shape = None if bias is None else bias.shape
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, g, _gm, _gv):
        x, mean, rstd, weight = ctx.saved_tensors
        dims, n = ctx.dims, ctx.n
        # local sums of g and g*x over the dims where the weight is constant (group norm's
        # weight varies inside a statistic's group, along the channels)
        fine = tuple(d for d in dims if weight is None or weight.shape[d] == 1)
        sg_full = g.sum(fine, keepdim=True) if fine else g
        sgx_full = _dot(g, x, fine) if fine else g * x
        # sum(g * x_hat) = rstd * (sum(g x) - mean * sum(g))
        gxhat_full = rstd * (sgx_full - mean * sg_full)
        dw = db = None
        if weight is not None and ctx.needs_input_grad[1]:
            dw = gxhat_full.sum_to_size(weight.shape)
        if ctx.bias_shape is not None and ctx.needs_input_grad[2]:
            db = sg_full.sum_to_size(ctx.bias_shape)
        w = weight if weight is not None else torch.ones((), dtype=x.dtype, device=x.device)
        # statistics are shared by everything the dims reduce over (and, with a weight that
        # varies inside a statistic's group -- group norm's channels -- summed over it too)
        sgw = (sg_full * w).sum(dims, keepdim=True)
        sgxw = (gxhat_full * w).sum(dims, keepdim=True)
        sums = _allreduce(torch.cat([sgw, sgxw]), ctx.groups) / n
        k = sums.shape[0] // 2
        s1, s2 = sums[:k], sums[k:]
        # dx = rstd * (g w - s1 - x_hat s2) = g * (rstd w) + x * B + C
        coef_b = -(rstd * rstd) * s2
        coef_c = -rstd * s1 - mean * coef_b
        dx = torch.addcmul(coef_c, x, coef_b).addcmul_(g, rstd * w)  # one full-size buffer
        return dx, dw, db, None, None, None, None


def _trailing(x: torch.Tensor, dims: Sequence[int]) -> bool:
    """``dims`` are the trailing dims of a contiguous, non-empty ``x`` (rows of a matrix)."""
    return (tuple(dims) == tuple(range(x.dim() - len(dims), x.dim())) and x.is_contiguous()
            and x.numel() > 0)


def _moments(x: torch.Tensor, dims: Sequence[int]):
    """Biased variance and mean over ``dims`` (keepdim). Over trailing dims of a contiguous
    tensor (group and instance norm) torch's row-moments kernel (layer norm's) is ~9x faster
    than ``var_mean`` over several dims on CPU; its output is discarded."""
    if not _trailing(x, dims):
        return torch.var_mean(x, dims, correction=0, keepdim=True)
    k = x.dim() - len(dims)
    lead = x.shape[:k]
    rows = x.reshape(math.prod(lead), math.prod(x.shape[k:]))
    _, mean, rstd = torch.ops.aten.native_layer_norm(rows, [rows.shape[1]], None, None, 0.0)
    shape = (*lead, *([1] * len(dims)))
    return rstd.pow(-2).reshape(shape), mean.reshape(shape)  # rstd = inf (constant row) -> 0


def _dot(g: torch.Tensor, x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """``(g * x).sum(dims, keepdim=True)`` without the full-size product where ``dims`` are
    trailing (one ``torch.dot`` per row)."""
    if not (_trailing(x, dims) and g.is_contiguous() and g.shape == x.shape):
        return (g * x).sum(dims, keepdim=True)
    k = x.dim() - len(dims)
    gr = g.reshape(math.prod(x.shape[:k]), math.prod(x.shape[k:]))
    xr = x.reshape(gr.shape)
    if gr.shape[0] > 256:
        out = torch.linalg.vecdot(gr, xr)
    else:
        out = torch.stack([torch.dot(a, b) for a, b in zip(gr, xr)])
    return out.reshape(*x.shape[:k], *([1] * len(dims)))


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
