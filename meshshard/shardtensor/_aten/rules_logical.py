"""``all`` / ``any`` on ShardTensors (``torch.equal``-style checks, masks' summaries): local,
then one all-reduce (min for ``all``, max for ``any``) over the mesh dims that shard a reduced
dim. An empty shard contributes the identity (True for ``all``, False for ``any``). Partial
inputs are summed first (a truth value of a partial sum is not a sum of truth values)."""

from __future__ import annotations

import torch

from meshshard.shardtensor._aten.rules import Plan, register_rule
from meshshard.shardtensor._aten.rules_reduce import (
    _prepare,
    all_reduce_op,
    norm_dims,
    padded,
    reduced_spec,
)

aten = torch.ops.aten
_ALL = (aten.all.default, aten.all.dim, aten.all.dims)


@register_rule(*_ALL, aten.any.default, aten.any.dim, aten.any.dims)
def _all_any(func, args, kwargs) -> Plan:
    x = args[0]
    steps, spec = _prepare(x)
    if func in (aten.all.default, aten.any.default):
        dims, keepdim = list(range(x.ndim)), False
    else:
        dims = norm_dims(args[1] if len(args) > 1 else kwargs.get("dim"), x.ndim)
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    out, over = reduced_spec(spec, dims, keepdim)
    kind = "min" if func in _ALL else "max"
    sharded = [spec.placements[i].dim for i in over]
    mesh = spec.mesh
    f = aten.amin.default if kind == "min" else aten.amax.default

    def call(loc, *_a, **_k):
        b = (loc != 0).to(torch.int32)
        r = f(padded(b, sharded, kind), dims, keepdim) if b.ndim else b
        for i in over:
            r = all_reduce_op(r, mesh, i, kind)
        return r.bool()

    return Plan(steps, (), call, out)
