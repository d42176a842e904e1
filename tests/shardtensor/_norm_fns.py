"""Cases for ``test_norm.py``: softmax / log-softmax and layer norm over the sharded dim (global
two-pass moments, weights narrowed, weight gradients complete), against one process (run by
:mod:`tests.shardtensor._rule_cases`, which describes a case)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.shardtensor._rule_cases import R, case, second_order


@case("norm", "softmax_over_sharded_dim", seed=1001)
def _c(x):
    t = x.masked_fill(x > 1.0, float("-inf"))  # masked entries, as in attention: weight 0
    return (x.softmax(1) * x, torch.log_softmax(x, 1), torch.softmax(t, 1) * 2,
            x.softmax(2), (x * 3).log_softmax(-1))


@case("norm", "layer_norm_over_sharded", seed=2000, plain_grads=True,
      extras=[(R, ("N", 5), True), (R, ("N", 5), True)])
def _c(x, w, b):
    n = x.shape[1]
    return (F.layer_norm(x, (n, 5), w, b), F.layer_norm(x * 3, (n, 5)),
            F.layer_norm(x, (n, 5), w) * x, F.layer_norm(x.sin(), (n, 5), None, b))


@case("norm", "layer_norm_all_dims", seed=2001, plain_grads=True, extras=[(R, (2, "N", 5), True)])
def _c(x, w):
    return F.layer_norm(x, tuple(x.shape), w, w * 0.5), F.layer_norm(x.cos(), tuple(x.shape))


@case("norm", "layer_norm_large_mean", seed=2002, plain_grads=True, extras=[(R, ("N", 5), True)])
def _c(x, w):
    # a mean 1e4 times the spread: a one-pass E[x^2] - E[x]^2 would lose ~8 digits (an error
    # ~1e-8, past the tolerance); the input's own rounding (1e4 * 1.1e-16) bounds the rest
    return (F.layer_norm(x + 1e4, (x.shape[1], 5), w),)


@case("norm", "layer_norm_partial_input", seed=2003, plain_grads=True,
      extras=[(R, (1, "N", 5), True)])
def _c(x, w):
    # on the 2-D mesh the sum over the batch is Partial on one mesh dim, sharded on the other
    t = x.sum(0, keepdim=True)
    return F.layer_norm(t, (x.shape[1], 5), w[0]), F.layer_norm(t * w, tuple(t.shape))


@case("norm", "layer_norm_blocked", seed=2004, plain_grads=True,
      extras=[(R, ("2N", 5), True)], mesh2d=False)
def _c(x, w):
    y = x.repeat(1, 2, 1)  # the sharded dim repeated: Blocked, each rank's rows in each block
    return F.layer_norm(y, tuple(y.shape[1:]), w, w.cos()), (F.layer_norm(y, (5,)) * y).sum(1)


@case("norm", "layer_norm_module_and_other_dims", seed=2005, plain_grads=True,
      extras=[(R, (5,), True)])
def _c(x, w):
    ln = torch.nn.LayerNorm((x.shape[1], 5), dtype=torch.float64)
    with torch.no_grad():
        ln.weight.mul_(2)
    return ln(x), F.layer_norm(x, (5,), w, w)  # the second stays local


@second_order("norm", seed=11)
def _through_layer_norm(n, g):
    """Through layer norm over the sharded dim (with a weight), a respecced product and a
    whole-row split view."""
    W = torch.randn(n, 5, generator=g, dtype=torch.float64)

    def f(x):
        y = F.layer_norm(x * x, (n, 5), W)
        z = x[:, 1:] * x[:, : n - 1]
        v = x.unsqueeze(2).expand(2, n, 3, 5).reshape(2, 3 * n, 5).reshape(2, n, 3, 5)
        return (y ** 3).sum() + (z * z).sum() + (v.sum(2) * x).sum()

    return f
