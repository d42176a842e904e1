"""Softmax and log-softmax over the sharded dim (attention over all points, a distribution
over the mesh's cells): the max and the normaliser are global, one all-reduce each; the
backward needs one more all-reduced sum. Over any other dim the rules in ``rules.py`` stay
(local, no communication).

Backward formulas (``y`` the output, ``g`` the incoming gradient, sums over the softmax dim):
softmax ``y * (g - sum(g * y))``, log-softmax ``g - exp(y) * sum(g)``. Each is made of aten
ops on local pieces plus one all-reduce, and autograd differentiates the wrapper-level ops, so
second order works through torch's own formulas for these two backward ops.
"""

from __future__ import annotations

import torch

from meshshard.shardtensor._aten import rules as _base
from meshshard.shardtensor._aten.rules import Plan, _reduced, _to_spec, register_rule
from meshshard.shardtensor._aten.rules_reduce import all_reduce_op, padded
from meshshard.shardtensor._aten.tensor import SHARDED

aten = torch.ops.aten
_LOCAL_FWD = _base._softmax
_LOCAL_BWD = _base._softmax_bwd


def _over(spec, dim: int) -> list[int]:
    """Mesh dims that shard ``dim`` (any blocks: a reduction over the whole dim is the same)."""
    return [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED) and p.dim == dim]


@register_rule(aten._softmax.default, aten._log_softmax.default, extends=_LOCAL_FWD)
def _softmax(func, args, kwargs) -> Plan:
    x, dim = args[0], args[1] % args[0].ndim
    over = _over(x._spec, dim)
    if not over:
        return _LOCAL_FWD(func, args, kwargs)
    steps, spec = _reduced(x, 0)
    mesh = spec.mesh
    log = func is aten._log_softmax.default

    def call(loc, *_a, **_k):
        m = aten.amax.default(padded(loc, [dim], "max"), [dim], True)
        for i in over:
            m = all_reduce_op(m, mesh, i, "max")
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(loc - m)
        s = aten.sum.dim_IntList(e, [dim], True)
        for i in over:
            s = all_reduce_op(s, mesh, i, "sum")
        return loc - m - s.log() if log else e / s

    return Plan(steps, (), call, spec)


@register_rule(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default,
               extends=_LOCAL_BWD)
def _softmax_bwd(func, args, kwargs) -> Plan:
    out, dim = args[1], args[2] % args[1].ndim
    over = _over(out._spec, dim)
    if not over:
        return _LOCAL_BWD(func, args, kwargs)
    mesh = out._spec.mesh
    log = func is aten._log_softmax_backward_data.default

    def call(g, y, *_a, **_k):
        s = aten.sum.dim_IntList(g if log else g * y, [dim], True)
        for i in over:
            s = all_reduce_op(s, mesh, i, "sum")
        return g - torch.exp(y) * s if log else y * (g - s)

    return Plan(_to_spec(args[0], 0, out._spec), (), call, out._spec)
