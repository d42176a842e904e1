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
        # local mean/var in one pass, merged exactly across ranks (Chan et al.):
        # mean = sum(n_r m_r) / n; var = sum(n_r (v_r + (m_r - mean)^2)) / n
        n_loc = 1
        for d in dims:
            n_loc *= x.shape[d]
        if n_loc:
            v_loc, m_loc = torch.var_mean(x, dims, correction=0, keepdim=True)
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
        sgx_full = (g * x).sum(fine, keepdim=True) if fine else g * x
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
        dx = torch.addcmul(torch.addcmul(coef_c, x, coef_b), g, rstd * w)
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
