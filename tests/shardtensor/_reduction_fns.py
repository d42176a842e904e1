"""Cases for ``test_reduction.py``: the reduction rules (all/any, max/min with the owner rule,
arg-reductions, var/std, norms, logsumexp, cumsum) over and beside the sharded dim, against one
process (run by :mod:`tests.shardtensor._rule_cases`, which describes a case)."""

from __future__ import annotations

import math

import torch

from tests.shardtensor._rule_cases import case, second_order


@case("reduction", "all_any", seed=1000, grad=False)
def _c(x):
    pos = x > -0.5
    return (pos.all(), pos.any(), pos.all(1), pos.any(1, keepdim=True), pos.all(2),
            (x == x).all(), (x > 100).any(), pos.all(dim=(0, 1)))


@case("reduction", "amax_amin", seed=1002)
def _c(x):
    return x.amax(1) + x.amin((0, 1)), x.amax(), x.amin(2, keepdim=True) * x


@case("reduction", "max_min_dim", seed=1003)
def _c(x):
    v, i = x.max(1)
    w, j = x.min(1, keepdim=True)
    u, k = x.max(2)
    return v * 2, i, w * 3, j, u, k


@case("reduction", "max_min_all", seed=1004)
def _c(x):
    return x.max() + 2 * x.min()


@case("reduction", "ties_owner_rule", seed=1005, mesh2d=True)
def _c(x):
    t = (x * 1.5).round()  # many equal values across ranks: the lowest global index wins
    v, i = t.max(1)
    w, j = t.min(1)
    return v * x.sum(1), i, w, j, t.argmax(1), t.argmin(), t.amax(1) * x.sum(1)


@case("reduction", "argmax_argmin", seed=1006, grad=False)
def _c(x):
    return x.argmax(1), x.argmin(1, keepdim=True), x.argmax(), x.argmin(), x.argmax(2)


@case("reduction", "var_std", seed=1007)
def _c(x):
    return (x.var(1), x.std(1, keepdim=True, correction=0), x.var(), x.var(2),
            x.std((0, 1), correction=2))


@case("reduction", "norms", seed=1008)
def _c(x):
    vn = torch.linalg.vector_norm
    return (x.norm(dim=1), vn(x, 3, dim=(1, 2)), vn(x, math.inf, dim=1), vn(x, 1),
            vn(x, -math.inf, dim=(0, 1)), vn(x, 0, dim=1) + x.sum(1))


@case("reduction", "logsumexp", seed=1009)
def _c(x):
    return (torch.logsumexp(x, 1), torch.logsumexp(x * 2, (0, 1), keepdim=True),
            torch.logsumexp(x, 2))


@case("reduction", "cumsum", seed=1010)
def _c(x):
    return x.cumsum(2), x.cumsum(1) * x, x.cumsum(0)


@second_order("reduction", seed=7)
def _through_reductions(n, g):
    """Through var, logsumexp, max.dim, gather, cumsum, vector_norm and (log-)softmax over
    the sharded dim."""
    gidx = torch.randint(0, 5, (2, n, 2), generator=g)

    def f(x):
        return ((x.var(1) * torch.logsumexp(x, 1)).sum() + (x.max(1).values ** 2).sum()
                + (x.gather(2, gidx) ** 3).sum() + (x.cumsum(2) * x).sum()
                + torch.linalg.vector_norm(x, dim=(0, 1)).sum()
                + (x.softmax(1) ** 2).sum() + (x.log_softmax(1) * x).sum())

    return f
