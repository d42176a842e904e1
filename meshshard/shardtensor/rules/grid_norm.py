"""Aten rules for group / batch / instance norm with global statistics.

Statistics are exact global sums: the mean from one all-reduce of local sums, then the
variance from one all-reduce of local squared deviations from that mean (two passes, as one
process computes them), over the mesh dims that shard the reduced dims -- the spatial ones for
group norm (per sample), every sharded one for batch norm. Backward needs two more global sums
per statistic, stacked into one all-reduce. Weight and bias gradients are Partial.

``instance_norm`` reaches aten as a view to ``(1, N*C, *spatial)`` and ``native_batch_norm``
(plus ``repeat`` of its weight), so the batch-norm rule covers it. Batch-norm running
statistics (plain buffers) are updated in place with the global mean and the unbiased global
variance, as one process would, so every rank holds the same buffers.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate, Shard

from meshshard.shardtensor._aten.dispatch import _all_reduce
from meshshard.shardtensor._aten.grid_checks import check_mesh
from meshshard.shardtensor._aten.tensor import ShardTensor, make_spec
from meshshard.shardtensor.rules.grid_conv import (
    grad_local,
    grid_input,
    partial_spec,
    register_rule,
    rep_local,
    replicate_spec_of,
    wrap,
)

aten = torch.ops.aten


def _reduce(t, spec, mesh_dims):
    for i in mesh_dims:
        t = _all_reduce(t, spec.mesh, i)
    return t


def _count(spec, dims) -> int:
    n = 1
    for d in dims:
        n *= int(spec.shape[d])
    return n


def _moments(xl, dims, spec, mesh_dims, count):
    """Global mean and biased variance over ``dims`` (keepdim), two exact passes."""
    mean = _reduce(xl.sum(dims, keepdim=True), spec, mesh_dims) / count
    dev = xl - mean
    var = _reduce((dev * dev).sum(dims, keepdim=True), spec, mesh_dims) / count
    return mean, var, dev


def _input_grad(gw, xhat, rstd, dims, spec, mesh_dims, count):
    """``rstd * (gw - mean(gw) - xhat * mean(gw * xhat))`` with global means over ``dims``."""
    a = gw.sum(dims, keepdim=True)
    s = _reduce(torch.cat([a, (gw * xhat).sum(dims, keepdim=True)], 0), spec, mesh_dims) / count
    k = a.shape[0]
    return rstd * (gw - s[:k] - xhat * s[k:])


def _channel_view(t, nd, c_dim=1):
    if t is None:
        return None
    shape = [1] * nd
    shape[c_dim] = -1
    return t.reshape(shape)


# ------------------------------------------------------------------ group norm
def _group_setup(x, op):
    local, spec, sharded = grid_input(x, x.ndim - 2, op)
    return local, spec, sorted(set(sharded.values()))


def _stat_spec(spec, shape):
    """(N, G) statistics: Shard(0) where the batch is sharded, else Replicate."""
    pl, sizes = [], []
    for i, p in enumerate(spec.placements):
        if isinstance(p, Shard) and p.dim == 0:
            pl.append(Shard(0))
            sizes.append(spec.sizes[i])
        else:
            pl.append(Replicate())
            sizes.append(None)
    return make_spec(spec.mesh, tuple(pl), tuple(sizes), tuple(int(v) for v in shape))


@register_rule(aten.native_group_norm.default, direct=True)
def _group_norm(func, args, kwargs):
    x, w, b, _n, c, _hxw, groups, eps = args
    local, spec, md = _group_setup(x, "native_group_norm")
    check_mesh("group_norm", spec.mesh, w, b)
    wl, bl = rep_local(w, "group_norm"), rep_local(b, "group_norm")
    n_loc, c = local.shape[0], int(c)
    per = c // groups
    xg = local.reshape(n_loc, groups, per, *local.shape[2:])
    dims = tuple(range(2, xg.ndim))
    count = per * _count(spec, range(2, x.ndim))
    mean, var, dev = _moments(xg, dims, spec, md, count)
    rstd = torch.rsqrt(var + eps)
    y = (dev * rstd).reshape(local.shape)
    if wl is not None:
        y = y * _channel_view(wl, local.ndim)
    if bl is not None:
        y = y + _channel_view(bl, local.ndim)
    ss = _stat_spec(spec, (x.shape[0], groups))
    return (ShardTensor(y, spec), ShardTensor(mean.reshape(n_loc, groups), ss),
            ShardTensor(rstd.reshape(n_loc, groups), ss))


@register_rule(aten.native_group_norm_backward.default, direct=True)
def _group_norm_backward(func, args, kwargs):
    g, x, mean, rstd, w, _n, c, _hxw, groups, mask = args
    local, spec, md = _group_setup(x, "native_group_norm_backward")
    gl = grad_local(g, spec)
    mean, rstd = rep_local_stats(mean), rep_local_stats(rstd)
    wl = rep_local(w, "group_norm")
    n_loc, c = local.shape[0], int(c)
    per = c // groups
    gshape = (n_loc, groups, per, *local.shape[2:])
    sshape = (n_loc, groups) + (1,) * (len(gshape) - 2)
    xg, gg = local.reshape(gshape), gl.reshape(gshape)
    dims = tuple(range(2, len(gshape)))
    xhat = (xg - mean.reshape(sshape)) * rstd.reshape(sshape)
    dx = dw = db = None
    if mask[0]:
        gw = gg if wl is None else gg * wl.reshape(1, groups, per, *([1] * (len(gshape) - 3)))
        count = per * _count(spec, range(2, x.ndim))
        dx = _input_grad(gw, xhat, rstd.reshape(sshape), dims, spec, md, count)
        dx = dx.reshape(local.shape)
    sum_dims = [0, *range(3, len(gshape))]
    if mask[1] and wl is not None:
        dw = (gg * xhat).sum(sum_dims).reshape(c)
    if mask[2]:
        db = gg.sum(sum_dims).reshape(c)
    ps = partial_spec(spec, (c,))
    return wrap(dx, spec), wrap(dw, ps), wrap(db, ps)


def rep_local_stats(t):
    """Saved statistics come back in the layout the forward gave them: use the local piece."""
    return t._local if type(t) is ShardTensor else t


# ------------------------------------------------------------------ batch norm
def _buf(t):
    return t._local if type(t) is ShardTensor else t


def _bn(x, w, b, rm, rv, training, momentum, eps, op):
    local, spec, _ = grid_input(x, x.ndim - 2, op)
    md = [i for i, p in enumerate(spec.placements) if isinstance(p, Shard)]
    check_mesh(op, spec.mesh, w, b, rm, rv)
    wl, bl = rep_local(w, op), rep_local(b, op)
    nd = local.ndim
    rm, rv = _buf(rm), _buf(rv)
    dims = [0, *range(2, nd)]
    if training:
        count = _count(spec, dims)
        mean, var, dev = _moments(local, dims, spec, md, count)
        rstd = torch.rsqrt(var + eps)
        y = dev * rstd
        mean, rstd, var = mean.reshape(-1), rstd.reshape(-1), var.reshape(-1)
        new_rm = new_rv = None
        if rm is not None:
            new_rm = rm * (1 - momentum) + mean.to(rm.dtype) * momentum
        if rv is not None:
            unbiased = var * (count / max(count - 1, 1))
            new_rv = rv * (1 - momentum) + unbiased.to(rv.dtype) * momentum
    else:
        y = (local - _channel_view(rm, nd)) * _channel_view(torch.rsqrt(rv + eps), nd)
        new_rm, new_rv = rm, rv
        mean = rstd = local.new_zeros((0,))  # as torch: nothing saved in eval mode
    if wl is not None:
        y = y * _channel_view(wl, nd)
    if bl is not None:
        y = y + _channel_view(bl, nd)
    rs = replicate_spec_of(spec, tuple(mean.shape))
    return ShardTensor(y, spec), wrap(mean, rs), wrap(rstd, rs), new_rm, new_rv, rs


def _copy_stats(rm, rv, new_rm, new_rv):
    with torch.no_grad():
        if rm is not None and new_rm is not None:
            _buf(rm).copy_(new_rm)
        if rv is not None and new_rv is not None:
            _buf(rv).copy_(new_rv)


@register_rule(aten.native_batch_norm.default, aten._native_batch_norm_legit.default, direct=True)
def _batch_norm(func, args, kwargs):
    x, w, b, rm, rv, training, momentum, eps = args
    y, mean, rstd, new_rm, new_rv, _ = _bn(x, w, b, rm, rv, training, momentum, eps,
                                           str(func))
    if training:
        _copy_stats(rm, rv, new_rm, new_rv)
    return y, mean, rstd


@register_rule(aten._native_batch_norm_legit.no_stats, direct=True)
def _batch_norm_no_stats(func, args, kwargs):
    x, w, b, training, momentum, eps = args
    y, mean, rstd, *_ = _bn(x, w, b, None, None, True, momentum, eps, str(func))
    return y, mean, rstd


@register_rule(aten._native_batch_norm_legit_no_training.default, direct=True)
def _batch_norm_eval(func, args, kwargs):
    x, w, b, rm, rv, momentum, eps = args
    y, mean, rstd, *_ = _bn(x, w, b, rm, rv, False, momentum, eps, str(func))
    return y, mean, rstd


@register_rule(aten._native_batch_norm_legit_functional.default, direct=True)
def _batch_norm_functional(func, args, kwargs):
    x, w, b, rm, rv, training, momentum, eps = args
    y, mean, rstd, new_rm, new_rv, rs = _bn(x, w, b, rm, rv, training, momentum, eps,
                                            str(func))
    return y, mean, rstd, new_rm, new_rv


@register_rule(aten.native_batch_norm_backward.default, direct=True)
def _batch_norm_backward(func, args, kwargs):
    g, x, w, rm, rv, smean, sinvstd, train, eps, mask = args
    op = "native_batch_norm_backward"
    local, spec, _ = grid_input(x, x.ndim - 2, op)
    md = [i for i, p in enumerate(spec.placements) if isinstance(p, Shard)]
    gl = grad_local(g, spec)
    wl = rep_local(w, op)
    nd = local.ndim
    dims = [0, *range(2, nd)]
    if train:
        mean, rstd = _channel_view(_buf(smean), nd), _channel_view(_buf(sinvstd), nd)
    else:
        mean, rstd = _channel_view(_buf(rm), nd), _channel_view(torch.rsqrt(_buf(rv) + eps), nd)
    xhat = (local - mean) * rstd
    wv = None if wl is None else _channel_view(wl, nd)
    gw = gl if wv is None else gl * wv
    dx = dw = db = None
    if mask[0]:
        dx = _input_grad(gw, xhat, rstd, dims, spec, md, _count(spec, dims)) if train \
            else gw * rstd
    if mask[1] and wl is not None:
        dw = (gl * xhat).sum(dims)
    if mask[2]:
        db = gl.sum(dims)
    ps = partial_spec(spec, (x.shape[1],))
    return wrap(dx, spec), wrap(dw, ps), wrap(db, ps)
