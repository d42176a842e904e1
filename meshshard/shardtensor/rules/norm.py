"""Normalisations over a dim that may be sharded: softmax, log-softmax and layer norm.

Over unsharded dims only they are local (no communication; a Partial input is summed first).
Over a sharded dim the statistics are global:

- softmax / log-softmax (attention over all points, a distribution over the mesh's cells): the
  max and the normaliser, one all-reduce each; the backward needs one more all-reduced sum.
  Backward formulas (``y`` the output, ``g`` the incoming gradient, sums over the softmax
  dim): softmax ``y * (g - sum(g * y))``, log-softmax ``g - exp(y) * sum(g)``. Each is made
  of aten ops on local pieces plus one all-reduce, and autograd differentiates the
  wrapper-level ops, so second order works through torch's own formulas for these two
  backward ops.
- layer norm whose normalized shape covers a sharded dim (a norm over all points, over a
  grid's channels and spatial dims). Forward: the mean from one all-reduce of local sums,
  then the variance from one all-reduce of local squared deviations from that mean (two exact
  passes, as one process computes them; a one-pass ``E[x^2] - E[x]^2`` loses digits when the
  mean is large), per mesh dim that shards a normalized dim. ``weight`` and ``bias`` (full,
  ``normalized_shape``) are narrowed to this rank's rows of the sharded dims; no collective.
  Backward (``xhat = (x - mean) * rstd``, ``gw = g * weight``, means over the normalized
  dims): ``dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))``, the two global sums
  stacked into one all-reduce. ``dweight = sum(g * xhat)``, ``dbias = sum(g)`` over the other
  dims: each rank has its rows of them, summed over the ranks that share those rows; they are
  completed (gathered and summed) into the layout the weight came in, so a plain weight's
  ``.grad`` equals one process's. Second order: torch's formula for
  ``native_layer_norm_backward`` is made of ops with rules (sums over the sharded dim,
  pointwise), so it works through them.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial

from meshshard.shardtensor._aten.dispatch import (
    _PSUM,
    _REP,
    Plan,
    _reduced,
    _replicated,
    _to_spec,
    respec_local,
)
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import SHARDED, ShardTensor, make_spec, shard_like
from meshshard.shardtensor.rules.reduction import all_reduce_op, padded

aten = torch.ops.aten


def _over_normalized(spec, axis: int) -> list[int]:
    """Mesh dims that shard a normalized dim (``>= axis``)."""
    return [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED) and p.dim >= axis]


def _weight_spec(spec, axis: int, over: list[int], shape):
    """A weight's layout beside ``spec``: this rank's rows of the sharded normalized dims,
    Replicate on every other mesh dim."""
    pl = tuple(shard_like(p, p.dim - axis) if i in over else _REP
               for i, p in enumerate(spec.placements))
    sizes = tuple(spec.sizes[i] if i in over else None for i in range(len(pl)))
    return make_spec(spec.mesh, pl, sizes, tuple(shape))


def _grad_spec(spec, axis: int, over: list[int], shape):
    """A weight gradient as each rank computes it: its rows of the sharded normalized dims,
    Partial (a sum over the ranks) on mesh dims that shard the other dims."""
    pl, sizes = [], []
    for i, p in enumerate(spec.placements):
        if i in over:
            pl.append(shard_like(p, p.dim - axis))
            sizes.append(spec.sizes[i])
        else:
            pl.append(Partial() if isinstance(p, SHARDED) else _REP)
            sizes.append(None)
    return make_spec(spec.mesh, tuple(pl), tuple(sizes), tuple(shape))


def _stat_spec(spec, axis: int, over: list[int]):
    shape = list(spec.shape[:axis]) + [1] * (len(spec.shape) - axis)
    pl = tuple(_REP if i in over else p for i, p in enumerate(spec.placements))
    sizes = tuple(None if i in over else s for i, s in enumerate(spec.sizes))
    return make_spec(spec.mesh, pl, sizes, tuple(shape))


def _count(spec, axis: int):
    n = 1
    for s in spec.shape[axis:]:
        n = n * s
    return n


def _sum_over(t: torch.Tensor, dims: list[int], mesh, over: list[int]) -> torch.Tensor:
    s = aten.sum.dim_IntList(t, dims, True)
    for i in over:
        s = all_reduce_op(s, mesh, i, "sum")
    return s


def _lead_sum(t: torch.Tensor, lead: list[int]) -> torch.Tensor:
    # an empty dim list would sum every dim
    return aten.sum.dim_IntList(t, lead, False) if lead else t


def _target(w, wspec_full):
    """The layout a weight's gradient goes back in: its own (a wrapper), else Replicate."""
    return w._spec if type(w) is ShardTensor else wspec_full


@register_rule(aten.native_layer_norm.default)
def _layer_norm(func, args, kwargs) -> Plan:
    x, nshape = args[0], list(args[1])
    axis = x.ndim - len(nshape)
    over = _over_normalized(x._spec, axis)
    if not over:
        return _local_layer_norm(x, axis)
    steps, spec = _reduced(x, 0)
    steps = list(steps)
    wspec = _weight_spec(spec, axis, over, nshape)
    for pos in (2, 3):
        if len(args) > pos and args[pos] is not None:
            steps.extend(_to_spec(args[pos], pos, wspec))
    mesh, dims, count = spec.mesh, list(range(axis, x.ndim)), _count(spec, axis)

    def call(xl, _ns, wl=None, bl=None, eps=1e-5):
        dtype = xl.dtype
        if dtype in (torch.float16, torch.bfloat16):  # as torch: accumulate in float
            xl = xl.float()
        mean = _sum_over(xl, dims, mesh, over) / count
        dev = xl - mean
        var = _sum_over(dev * dev, dims, mesh, over) / count
        rstd = torch.rsqrt(var + eps)
        out = dev * rstd
        if wl is not None:
            out = out * wl
        if bl is not None:
            out = out + bl
        return out.to(dtype), mean.to(dtype), rstd.to(dtype)

    sspec = _stat_spec(spec, axis, over)
    return Plan(tuple(steps), (), call, (spec, sspec, sspec))


@register_rule(aten.native_layer_norm_backward.default)
def _layer_norm_bwd(func, args, kwargs) -> Plan:
    g, x, nshape, mean, rstd, w, b, mask = args
    nshape = list(nshape)
    axis = x.ndim - len(nshape)
    over = _over_normalized(x._spec, axis)
    if not over:
        return _local_layer_norm_bwd(g, x, w, b)
    steps, spec = _reduced(x, 1)
    steps = list(steps)
    steps.extend(_to_spec(g, 0, spec))
    sspec = _stat_spec(spec, axis, over)
    steps.extend(_to_spec(mean, 3, sspec))
    steps.extend(_to_spec(rstd, 4, sspec))
    wspec = _weight_spec(spec, axis, over, nshape)
    if w is not None:
        steps.extend(_to_spec(w, 5, wspec))
    mesh, dims, count = spec.mesh, list(range(axis, x.ndim)), _count(spec, axis)
    lead = list(range(axis))
    gspec = _grad_spec(spec, axis, over, nshape)
    full = _replicated(gspec)
    want_w = bool(mask[1]) and w is not None
    want_b = bool(mask[2]) and b is not None
    tw = _target(w, full) if want_w else None
    tb = _target(b, full) if want_b else None

    def call(gl, xl, _ns, m, r, wl, _bl, _mask):
        xhat = (xl - m) * r
        gw = gl if wl is None else gl * wl
        dx = dw = db = None
        if mask[0]:
            s = aten.sum.dim_IntList(torch.stack([gw, gw * xhat]), [d + 1 for d in dims], True)
            for i in over:
                s = all_reduce_op(s, mesh, i, "sum")
            s = s / count
            dx = r * (gw - s[0] - xhat * s[1])
        if want_w:
            dw = respec_local(_lead_sum(gl * xhat, lead), gspec, tw)
        if want_b:
            db = respec_local(_lead_sum(gl, lead), gspec, tb)
        return dx, dw, db

    return Plan(tuple(steps), (), call, (spec if mask[0] else None, tw, tb))


# ------------------------------------------------------------------ over unsharded dims: local
def _local_softmax(x) -> Plan:
    steps, spec = _reduced(x, 0)
    return Plan(steps, (), None, spec)


def _local_softmax_bwd(g, out) -> Plan:
    return Plan(_to_spec(g, 0, out._spec), (), None, out._spec)


def _local_layer_norm(x, axis: int) -> Plan:
    steps, spec = _reduced(x, 0)
    stat_shape = list(spec.shape[:axis]) + [1] * (x.ndim - axis)
    sspec = make_spec(spec.mesh, spec.placements, spec.sizes, tuple(stat_shape))
    return Plan(steps, (), None, (spec, sspec, sspec))


def _local_layer_norm_bwd(g, x, w, b) -> Plan:
    spec = x._spec
    pl = tuple(_PSUM if isinstance(p, SHARDED) else p for p in spec.placements)
    none = (None,) * spec.mesh.ndim
    outs = (spec,) + tuple(None if ref is None else make_spec(spec.mesh, pl, none,
                                                              tuple(ref.shape))
                           for ref in (w, b))
    return Plan(_to_spec(g, 0, spec), (), None, outs)


# ------------------------------------------------------------------ softmax / log-softmax
def _over_dim(spec, dim: int) -> list[int]:
    """Mesh dims that shard ``dim`` (any blocks: a reduction over the whole dim is the same)."""
    return [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED) and p.dim == dim]


@register_rule(aten._softmax.default, aten._log_softmax.default)
def _softmax(func, args, kwargs) -> Plan:
    x, dim = args[0], args[1] % args[0].ndim
    over = _over_dim(x._spec, dim)
    if not over:
        return _local_softmax(x)
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


@register_rule(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def _softmax_bwd(func, args, kwargs) -> Plan:
    out, dim = args[1], args[2] % args[1].ndim
    over = _over_dim(out._spec, dim)
    if not over:
        return _local_softmax_bwd(args[0], out)
    mesh = out._spec.mesh
    log = func is aten._log_softmax_backward_data.default

    def call(g, y, *_a, **_k):
        s = aten.sum.dim_IntList(g if log else g * y, [dim], True)
        for i in over:
            s = all_reduce_op(s, mesh, i, "sum")
        return g - torch.exp(y) * s if log else y * (g - s)

    return Plan(_to_spec(args[0], 0, out._spec), (), call, out._spec)
