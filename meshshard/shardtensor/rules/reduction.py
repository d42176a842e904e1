"""Reductions: sum/mean, max/min (values + indices), amax/amin, argmax/argmin, var/std,
``linalg_vector_norm``, logsumexp, cumsum, topk, all/any, over the sharded dim, other dims or
all dims, with ``keepdim``.

Sum and mean over a sharded dim are Partial (a mean divides the local sum by the global
count), so they merge with the next linear op and are reduced once, when a value is needed.

Over a sharded dim the result is Replicate on that mesh dim: non-linear reductions all-reduce
at once (max/min with ``max``/``min``, the others through global sums and global counts). An
empty local shard contributes the reduction's identity (a padded row of -inf/+inf), so no
rule branches on the data. Indices follow today's owner rule: the lowest *global* index among
the ranks holding the extreme value. Backward formulas are torch's own, made of ops that have
rules (``new_zeros`` + ``scatter`` for max.dim; masks, sums and pointwise ops otherwise).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial

from meshshard.shardtensor._aten.collective_ops import fc as _fc
from meshshard.shardtensor._aten.dispatch import (
    _PSUM,
    _REP,
    SHARDED,
    Plan,
    _coord,
    _reduced,
    check,
)
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import make_spec, shard_like
from meshshard.shardtensor.rules import (
    all_gather,
    all_reduce,
    shard_offset,
    sharded_mesh_dims,
    spec_of,
    with_dim_replicated,
)

aten = torch.ops.aten


all_reduce_op = all_reduce  # (the public helper; other rule modules import this name)


# ------------------------------------------------------------------ sum / mean
def _reduce_rule(func, args, kwargs, mean: bool, default: bool) -> Plan:
    x = args[0]
    spec = x._spec
    nd = x.ndim
    dims = None if default else (args[1] if len(args) > 1 else None)
    keepdim = False if default else (args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(nd))
    dims = sorted({(d + nd) % nd for d in ([dims] if isinstance(dims, int) else dims)})
    placements, sizes = [], []
    over_shard = False
    for i, p in enumerate(spec.placements):
        if isinstance(p, SHARDED):
            if p.dim in dims:
                placements.append(_PSUM)
                sizes.append(None)
                over_shard = True
            else:
                nd_out = p.dim if keepdim else p.dim - sum(1 for d in dims if d < p.dim)
                placements.append(shard_like(p, nd_out))
                sizes.append(spec.sizes[i])
        else:
            placements.append(p)
            sizes.append(None)
    out_shape = [s for d, s in enumerate(spec.shape) if d not in dims] if not keepdim else [
        1 if d in dims else s for d, s in enumerate(spec.shape)]
    out = make_spec(spec.mesh, tuple(placements), tuple(sizes), tuple(out_shape))
    call = None
    if mean and over_shard:  # local sum / global count
        count = 1
        for d in dims:
            count = count * spec.shape[d]

        def call(loc, *_a, dtype=None, **_k):
            return aten.sum.dim_IntList(loc, dims, keepdim, dtype=dtype) / count

    return Plan((), (), call, out)


@register_rule(aten.sum.dim_IntList, aten.sum.default)
def _sum(func, args, kwargs) -> Plan:
    return _reduce_rule(func, args, kwargs, False, func is aten.sum.default)


@register_rule(aten.mean.dim, aten.mean.default)
def _mean(func, args, kwargs) -> Plan:
    return _reduce_rule(func, args, kwargs, True, func is aten.mean.default)


def norm_dims(dim, nd: int) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(nd))
    return sorted({(d + nd) % max(nd, 1) for d in ([dim] if isinstance(dim, int) else dim)})


def reduced_spec(spec, dims: list[int], keepdim: bool, placement=_REP):
    """(output spec, mesh dims reduced over): a sharded dim in ``dims`` gets ``placement``."""
    placements, sizes, over = [], [], []
    for i, p in enumerate(spec.placements):
        if isinstance(p, SHARDED) and p.dim in dims:
            if getattr(p, "blocks", 1) != 1:
                msg = f"a reduction over the blocked dim {p} (flatten it back first)"
                raise NotImplementedError(msg)
            placements.append(placement)
            sizes.append(None)
            over.append(i)
        elif isinstance(p, SHARDED):
            placements.append(shard_like(p, p.dim if keepdim
                                         else p.dim - sum(1 for d in dims if d < p.dim)))
            sizes.append(spec.sizes[i])
        else:
            placements.append(p)
            sizes.append(None)
    shape = [1 if d in dims else s for d, s in enumerate(spec.shape)] if keepdim else [
        s for d, s in enumerate(spec.shape) if d not in dims]
    return make_spec(spec.mesh, tuple(placements), tuple(sizes), tuple(shape)), over


def _fill(dtype, kind: str):
    if dtype.is_floating_point:
        return float("-inf") if kind == "max" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if kind == "max" else info.max


def padded(loc: torch.Tensor, dims, kind: str) -> torch.Tensor:
    """``loc`` with one row of the reduction's identity appended along each of ``dims``: an
    empty local shard then reduces to the identity, with no branch on its size."""
    for d in dims:
        shape = list(loc.shape)
        shape[d] = 1
        loc = torch.cat([loc, loc.new_full(shape, _fill(loc.dtype, kind))], d)
    return loc


def _prepare(x):
    """Partial placements reduced first (max of a partial sum is not a sum of maxes)."""
    steps, spec = _reduced(x, 0)
    return steps, spec


# ------------------------------------------------------------------ amax / amin / max / min
def _extreme_call(spec, dims, keepdim, over, kind):
    sharded_dims = [spec.placements[i].dim for i in over]
    mesh = spec.mesh
    f = aten.amax.default if kind == "max" else aten.amin.default

    def call(loc, *_a, **_k):
        out = f(padded(loc, sharded_dims, kind), dims, keepdim)
        for i in over:
            out = all_reduce_op(out, mesh, i, kind)
        return out

    return call


@register_rule(aten.amax.default, aten.amin.default)
def _amax(func, args, kwargs) -> Plan:
    x = args[0]
    steps, spec = _prepare(x)
    dims = norm_dims(args[1] if len(args) > 1 else kwargs.get("dim", []), x.ndim)
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    out, over = reduced_spec(spec, dims, keepdim)
    kind = "max" if func is aten.amax.default else "min"
    return Plan(steps, (), _extreme_call(spec, dims, keepdim, over, kind), out)


@register_rule(aten.max.default, aten.min.default)
def _max_all(func, args, kwargs) -> Plan:
    x = args[0]
    steps, spec = _prepare(x)
    dims = list(range(x.ndim))
    out, over = reduced_spec(spec, dims, False)
    kind = "max" if func is aten.max.default else "min"
    return Plan(steps, (), _extreme_call(spec, dims, False, over, kind), out)


def _winner(v, ix, mesh, i, kind):
    """(global extreme, lowest global index holding it) over mesh dim ``i``."""
    vg = all_reduce_op(v, mesh, i, kind)
    big = torch.iinfo(torch.int64).max
    cand = torch.where(v == vg, ix, torch.full_like(ix, big))
    return vg, all_reduce_op(cand, mesh, i, "min")


def _offset(spec, i):
    return sum(spec.sizes[i][: _coord(spec.mesh)[1][i]])


@register_rule(aten.max.dim, aten.min.dim)
def _max_dim(func, args, kwargs) -> Plan:
    x = args[0]
    steps, spec = _prepare(x)
    d = args[1] % max(x.ndim, 1)
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    out, over = reduced_spec(spec, [d], keepdim)
    if not over:
        return Plan(steps, (), None, (out, out))
    kind = "max" if func is aten.max.dim else "min"
    mesh, (i,) = spec.mesh, over
    off = _offset(spec, i)

    def call(loc, *_a, **_k):
        v, ix = func(padded(loc, [d], kind), d, keepdim)
        return _winner(v, ix + off, mesh, i, kind)

    return Plan(steps, (), call, (out, out))


@register_rule(aten.argmax.default, aten.argmin.default)
def _argmax(func, args, kwargs) -> Plan:
    x = args[0]
    steps, spec = _prepare(x)
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    kind = "max" if func is aten.argmax.default else "min"
    mesh = spec.mesh
    if dim is not None:
        d = dim % max(x.ndim, 1)
        out, over = reduced_spec(spec, [d], keepdim)
        if not over:
            return Plan(steps, (), None, out)
        (i,) = over
        off = _offset(spec, i)
        pair = aten.max.dim if kind == "max" else aten.min.dim

        def call(loc, *_a, **_k):
            v, ix = pair(padded(loc, [d], kind), d, keepdim)
            return _winner(v, ix + off, mesh, i, kind)[1]

        return Plan(steps, (), call, out)
    # over all dims: the global flat index of the winner
    dims = list(range(x.ndim))
    out, over = reduced_spec(spec, dims, keepdim)
    if not over:
        return Plan(steps, (), None, out)
    gshape = list(spec.shape)
    offs = [0] * x.ndim
    for i in over:
        offs[spec.placements[i].dim] = _offset(spec, i)
    gstride, acc = [0] * x.ndim, 1
    for d in reversed(dims):
        gstride[d], acc = acc, acc * gshape[d]
    pair = aten.max.dim if kind == "max" else aten.min.dim

    def call(loc, *_a, **_k):
        lshape = list(loc.shape)
        v, j = pair(padded(loc.reshape(-1), [0], kind), 0, False)
        flat = torch.zeros_like(j)
        rest = j
        for d in reversed(dims):  # unravel the local index, shift it, ravel it globally
            n = max(lshape[d], 1)
            flat = flat + (rest % n + offs[d]) * gstride[d]
            rest = rest // n
        for i in over:
            v, flat = _winner(v, flat, mesh, i, kind)
        return flat.reshape([1] * x.ndim) if keepdim else flat

    return Plan(steps, (), call, out)


# ------------------------------------------------------------------ var / std
def _global_sum(t, dims, keepdim, mesh, over):
    s = aten.sum.dim_IntList(t, dims, keepdim)
    for i in over:
        s = all_reduce_op(s, mesh, i, "sum")
    return s


@register_rule(aten.var.correction, aten.std.correction)
def _var(func, args, kwargs) -> Plan:
    x = args[0]
    steps, spec = _prepare(x)
    dims = norm_dims(args[1] if len(args) > 1 else kwargs.get("dim"), x.ndim)
    keepdim = kwargs.get("keepdim", False)
    correction = kwargs.get("correction")
    correction = 1 if correction is None else correction
    out, over = reduced_spec(spec, dims, keepdim)
    if not over:
        return Plan(steps, (), None, out)
    mesh = spec.mesh
    n = 1
    for d in dims:
        n = n * spec.shape[d]
    std = func is aten.std.correction

    def call(loc, *_a, **_k):
        mean = _global_sum(loc, dims, True, mesh, over) / n
        var = _global_sum((loc - mean) ** 2, dims, keepdim, mesh, over) / max(n - correction, 0)
        return var.sqrt() if std else var

    return Plan(steps, (), call, out)


# ------------------------------------------------------------------ norms
@register_rule(aten.linalg_vector_norm.default)
def _vector_norm(func, args, kwargs) -> Plan:
    x = args[0]
    steps, spec = _prepare(x)
    ord_ = args[1] if len(args) > 1 else kwargs.get("ord", 2)
    dims = norm_dims(args[2] if len(args) > 2 else kwargs.get("dim"), x.ndim)
    keepdim = args[3] if len(args) > 3 else kwargs.get("keepdim", False)
    dtype = kwargs.get("dtype")
    out, over = reduced_spec(spec, dims, keepdim)
    if not over:
        return Plan(steps, (), None, out)
    mesh = spec.mesh
    sharded_dims = [spec.placements[i].dim for i in over]
    o = float(ord_)

    def call(loc, *_a, **_k):
        a = (loc if dtype is None else loc.to(dtype)).abs()
        if o in (float("inf"), float("-inf")):
            kind = "max" if o > 0 else "min"
            f = aten.amax.default if kind == "max" else aten.amin.default
            r = f(padded(a, sharded_dims, kind), dims, keepdim)
            for i in over:
                r = all_reduce_op(r, mesh, i, kind)
            return r
        if o == 0:
            return _global_sum((a != 0).to(a.dtype), dims, keepdim, mesh, over)
        if o == 1:
            return _global_sum(a, dims, keepdim, mesh, over)
        if o == 2:
            return _global_sum(a * a, dims, keepdim, mesh, over).sqrt()
        return _global_sum(a ** o, dims, keepdim, mesh, over) ** (1.0 / o)

    return Plan(steps, (), call, out)


@register_rule(aten.logsumexp.default)
def _logsumexp(func, args, kwargs) -> Plan:
    x = args[0]
    steps, spec = _prepare(x)
    dims = norm_dims(args[1], x.ndim)
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    out, over = reduced_spec(spec, dims, keepdim)
    if not over:
        return Plan(steps, (), None, out)
    mesh = spec.mesh
    sharded_dims = [spec.placements[i].dim for i in over]

    def call(loc, *_a, **_k):
        m = aten.amax.default(padded(loc, sharded_dims, "max"), dims, True)
        for i in over:
            m = all_reduce_op(m, mesh, i, "max")
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        r = _global_sum(torch.exp(loc - m), dims, True, mesh, over).log() + m
        return r if keepdim else r.squeeze(dims)

    return Plan(steps, (), call, out)


# ------------------------------------------------------------------ scans
@register_rule(aten.cumsum.default)
def _cumsum(func, args, kwargs) -> Plan:
    """Along an unsharded dim: local (a Partial stays Partial: cumsum is linear). Along the
    sharded dim: local cumsum plus the totals of the ranks before (one all-gather of each
    rank's one-row total)."""
    x = args[0]
    spec = x._spec
    d = args[1] % max(x.ndim, 1)
    over = [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED) and p.dim == d]
    if not over:
        return Plan(outs=spec)
    (i,) = over
    if getattr(spec.placements[i], "blocks", 1) != 1 or any(
            isinstance(p, Partial) for p in spec.placements):
        msg = f"{func} along the sharded dim of {spec} (blocked or partial input)"
        raise NotImplementedError(msg)
    mesh, n = spec.mesh, spec.mesh.size(i)
    me = _coord(mesh)[1][i]
    name = _coord(mesh)[2][i]

    def call(loc, dim, *_a, dtype=None, **_k):
        c = aten.cumsum.default(loc, d, dtype=dtype)
        if n == 1:
            return c
        tot = aten.sum.dim_IntList(loc, [d], True, dtype=c.dtype)
        check("all_gather", mesh, i, tot, "cumsum totals")
        g = _fc.wait_tensor(_fc.all_gather_into_tensor(tot.movedim(d, 0).contiguous(), n,
                                                       name))
        before = g.narrow(0, 0, me).sum(0, keepdim=True).movedim(0, d)
        return c + before

    return Plan((), (), call, spec)


# ------------------------------------------------------------------ nansum
@register_rule(aten.nansum.default)
def _nansum(func, args, kwargs) -> Plan:
    """A local ``nansum``, Partial over the mesh dims that shard a reduced dim (the sum of the
    ranks' NaN-free sums is the NaN-free sum). A Partial input is summed first: a NaN in one
    rank's partial value is not a NaN of the sum."""
    x = args[0]
    steps, spec = _prepare(x)
    dims = norm_dims(args[1] if len(args) > 1 else kwargs.get("dim"), x.ndim)
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    out, _ = reduced_spec(spec, dims, keepdim, placement=_PSUM)
    return Plan(steps, (), None, out)


# ------------------------------------------------------------------ top k
@register_rule(aten.topk.default)
def _topk(func, args, kwargs) -> Plan:
    """``topk`` along the sharded dim: each rank sorts its rows (plus k rows of the identity,
    so an empty or short shard still offers k candidates), all-gathers its first k values and
    global indices, and every rank picks the same k of those P*k candidates. Ties go to the
    lowest global index, and real rows always beat the padding. Along any other dim: left to
    the fallback (local)."""
    x = args[0]
    k = args[1]
    d = (args[2] if len(args) > 2 else kwargs.get("dim", -1)) % max(x.ndim, 1)
    largest = args[3] if len(args) > 3 else kwargs.get("largest", True)
    over = sharded_mesh_dims(spec_of(x), d)
    if not over:
        return NotImplemented  # the fallback runs it on the local pieces
    steps, spec = _reduced(x, 0)  # a Partial input is summed first
    if len(over) > 1 or getattr(spec.placements[over[0]], "blocks", 1) != 1:
        msg = f"{func} along dim {d}, sharded on several mesh dims or blocked ({spec})"
        raise NotImplementedError(msg)
    (i,) = over
    if not 0 <= k <= spec.shape[d]:
        msg = f"{func}: k={k} out of range for dim {d} of size {spec.shape[d]}"
        raise IndexError(msg)
    mesh, off, n = spec.mesh, shard_offset(spec, i), spec.mesh.size(i)
    fill = _fill(x.dtype, "max" if largest else "min")
    out = with_dim_replicated(spec, d, k)

    def call(loc, *_a, **_k):
        rows = loc.shape[d]
        pad_shape = list(loc.shape)
        pad_shape[d] = k
        cand = torch.cat([loc, loc.new_full(pad_shape, fill)], d)
        # a stable sort keeps real rows ahead of equal padding
        v, ix = torch.sort(cand, dim=d, descending=largest, stable=True)
        v, ix = v.narrow(d, 0, k), ix.narrow(d, 0, k)
        pad = (ix >= rows).to(torch.int64)
        gix = ix + off
        sizes = (k,) * n
        v, gix, pad = (all_gather(t, d, sizes, mesh, i) for t in (v, gix, pad))
        # order the P*k candidates by (value, padding last, global index): three stable sorts
        o = torch.sort(gix, dim=d, stable=True)[1]
        v, gix, pad = (t.gather(d, o) for t in (v, gix, pad))
        o = torch.sort(pad, dim=d, stable=True)[1]
        v, gix = (t.gather(d, o) for t in (v, gix))
        v, o = torch.sort(v, dim=d, descending=largest, stable=True)
        return v.narrow(d, 0, k), gix.gather(d, o).narrow(d, 0, k)

    return Plan(steps, (), call, (out, out))


# ------------------------------------------------------------------ all / any
# Local, then one all-reduce (min for ``all``, max for ``any``) over the mesh dims that shard a
# reduced dim. An empty shard contributes the identity (True for ``all``, False for ``any``).
# Partial inputs are summed first (a truth value of a partial sum is not a sum of truth values).
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
