"""Reductions: sum, mean, max/min (amax, amin, argmax, argmin), var, std, norm, logsumexp.

Over a sharded dim they use *global* counts: ``mean = global sum / global N``. Linear
reductions (sum, mean) return Partial and are all-reduced when a later op needs it; the others
all-reduce at once and return Replicate on that mesh dim.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.collective_check import check_collective
from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._generic import pointwise_apply
from meshshard.shardtensor._layout import reduce_partials, wrap
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import register_handler
from meshshard.shardtensor.spec import ShardSpec, intern_spec, mesh_group


def _norm_dims(dim, ndim: int) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    out = tuple(sorted({d + ndim if d < 0 else d for d in dim}))
    for d in out:
        if not 0 <= d < max(ndim, 1):
            msg = f"dim {d} out of range for a {ndim}-d tensor"
            raise IndexError(msg)
    return out if out or ndim == 0 else tuple(range(ndim))


def _out_spec(spec: ShardSpec, dims, keepdim: bool, sharded_reduced) -> ShardSpec:
    """Spec after reducing ``dims``; sharded reduced mesh dims get ``sharded_reduced`` (a
    placement) with no sizes."""
    nd = spec.ndim
    shape = [1 if d in dims else s for d, s in enumerate(spec.shape)] if keepdim else [
        s for d, s in enumerate(spec.shape) if d not in dims
    ]
    placements, sizes = [], []
    for i, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            if p.dim in dims:
                placements.append(sharded_reduced)
                sizes.append(None)
            else:
                nd_before = 0 if keepdim else sum(1 for d in dims if d < p.dim)
                placements.append(Shard(p.dim - nd_before))
                sizes.append(spec.sizes[i])
        else:
            placements.append(p)
            sizes.append(None)
    del nd
    return intern_spec(ShardSpec(spec.mesh, tuple(placements), tuple(sizes), torch.Size(shape)))


def _sharded_mesh_dims(spec: ShardSpec, dims) -> list[int]:
    return [i for i, p in enumerate(spec.placements) if isinstance(p, Shard) and p.dim in dims]


@register_handler(torch.sum, torch.Tensor.sum)
def _sum(x, dim=None, keepdim=False, *, dtype=None):
    x = _only_sum_partials(x)
    dims = _norm_dims(dim, x._spec.ndim)
    local = x._local
    out = local.sum(dim=dims, keepdim=keepdim, dtype=dtype) if dims else local.sum(dtype=dtype)
    return wrap(out, _out_spec(x._spec, dims, keepdim, Partial("sum")))


@register_handler(torch.mean, torch.Tensor.mean)
def _mean(x, dim=None, keepdim=False, *, dtype=None):
    x = _only_sum_partials(x)
    dims = _norm_dims(dim, x._spec.ndim)
    count = math.prod(x._spec.shape[d] for d in dims)
    local = x._local
    s = local.sum(dim=dims, keepdim=keepdim, dtype=dtype) if dims else local.sum(dtype=dtype)
    return wrap(s / count, _out_spec(x._spec, dims, keepdim, Partial("sum")))


def _only_sum_partials(x):
    if any(isinstance(p, Partial) and p.reduce_op != "sum" for p in x._spec.placements):
        return reduce_partials(x)
    return x


def _extreme_local(local, dims, keepdim, kind):
    """amax/amin that tolerates an empty local shard (gives -inf / +inf)."""
    if local.numel() == 0 and any(local.shape[d] == 0 for d in dims):
        shape = [1 if d in dims else s for d, s in enumerate(local.shape)] if keepdim else [
            s for d, s in enumerate(local.shape) if d not in dims
        ]
        fill = -math.inf if kind == "max" else math.inf
        if not local.dtype.is_floating_point:
            info = torch.iinfo(local.dtype)
            fill = info.min if kind == "max" else info.max
        return torch.full(shape, fill, dtype=local.dtype, device=local.device) + local.sum() * 0
    f = torch.amax if kind == "max" else torch.amin
    return f(local, dim=dims, keepdim=keepdim)


def _amax_amin(x, dim, keepdim, kind):
    x = reduce_partials(x)
    dims = _norm_dims(dim, x._spec.ndim)
    local = _extreme_local(x._local, dims, keepdim, kind)
    spec = _out_spec(x._spec, dims, keepdim, Replicate())
    for i in _sharded_mesh_dims(x._spec, dims):
        local = C.all_reduce(local, kind, mesh_group(x._spec.mesh, i))
    return wrap(local, spec)


@register_handler(torch.amax, torch.Tensor.amax)
def _amax(x, dim=(), keepdim=False):
    return _amax_amin(x, None if dim == () else dim, keepdim, "max")


@register_handler(torch.amin, torch.Tensor.amin)
def _amin(x, dim=(), keepdim=False):
    return _amax_amin(x, None if dim == () else dim, keepdim, "min")


def _max_min_dim(x, dim, keepdim, kind):
    """(values, global indices) of max/min along one dim."""
    x = reduce_partials(x)
    nd = x._spec.ndim
    d = dim + nd if dim < 0 else dim
    mesh_dims = _sharded_mesh_dims(x._spec, (d,))
    f = torch.max if kind == "max" else torch.min
    local = x._local
    spec = _out_spec(x._spec, (d,), keepdim, Replicate())
    rt = torch.return_types.max if kind == "max" else torch.return_types.min
    if not mesh_dims:
        v, ix = f(local, dim=d, keepdim=keepdim)
        return rt((wrap(v, spec), wrap(ix, spec)))
    (i,) = mesh_dims
    group = mesh_group(x._spec.mesh, i)
    offset = x._spec.offset(d)
    if local.shape[d] == 0:
        v = _extreme_local(local, (d,), keepdim, kind)
        ix = torch.zeros(v.shape, dtype=torch.int64, device=local.device)
    else:
        v, ix = f(local, dim=d, keepdim=keepdim)
        ix = ix + offset
    vg = C.all_reduce(v, kind, group)
    # winner: lowest global index among ranks holding the extreme value
    big = torch.iinfo(torch.int64).max
    cand = torch.where(v.detach() == vg.detach(), ix, torch.full_like(ix, big))
    if x._spec.mesh.size(i) > 1:
        from meshshard.shardtensor._tracemode import reduce

        check_collective("all_reduce", group, cand, detail=f"min: arg{kind} index")
        cand = reduce(cand, "min", group)
    return rt((wrap(vg, spec), wrap(cand, spec)))


def _max_like(kind):
    f = torch.maximum if kind == "max" else torch.minimum

    def handler(x, dim=None, keepdim=False, *, out=None):
        if isinstance(dim, torch.Tensor):  # torch.max(a, b): elementwise
            return pointwise_apply(f, (x, dim), {})
        if dim is None:
            return _amax_amin(x, None, False, kind)
        return _max_min_dim(x, dim, keepdim, kind)

    return handler


register_handler(torch.max, torch.Tensor.max)(_max_like("max"))
register_handler(torch.min, torch.Tensor.min)(_max_like("min"))


@register_handler(torch.argmax, torch.Tensor.argmax)
def _argmax(x, dim=None, keepdim=False):
    if dim is None:
        x = x.reshape(-1)
        dim = 0
    return _max_min_dim(x, dim, keepdim, "max")[1]


@register_handler(torch.argmin, torch.Tensor.argmin)
def _argmin(x, dim=None, keepdim=False):
    if dim is None:
        x = x.reshape(-1)
        dim = 0
    return _max_min_dim(x, dim, keepdim, "min")[1]


def _global_sum(local, dims, keepdim, spec):
    s = local.sum(dim=dims, keepdim=keepdim) if dims else local.sum()
    for i in _sharded_mesh_dims(spec, dims):
        s = C.all_reduce(s, "sum", mesh_group(spec.mesh, i))
    return s


def _var_impl(x, dim, correction, keepdim):
    x = reduce_partials(x)
    spec = x._spec
    dims = _norm_dims(dim, spec.ndim)
    if not _sharded_mesh_dims(spec, dims):
        local = torch.var(x._local, dim=dims, correction=correction, keepdim=keepdim)
        return wrap(local, _out_spec(spec, dims, keepdim, Replicate()))
    n = math.prod(spec.shape[d] for d in dims)
    groups = [mesh_group(spec.mesh, i) for i in _sharded_mesh_dims(spec, dims)]
    mean = C.grad_all_reduce(_global_sum(x._local, dims, True, spec) / n, groups)
    dev2 = _global_sum((x._local - mean) ** 2, dims, keepdim, spec)
    var = dev2 / max(n - correction, 0)
    return wrap(var, _out_spec(spec, dims, keepdim, Replicate()))


def _correction(unbiased, correction):
    if correction is not None:
        return correction
    if unbiased is None:
        return 1
    return 1 if unbiased else 0


@register_handler(torch.var, torch.Tensor.var)
def _var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):  # var(unbiased) legacy overload
        dim, unbiased = None, dim
    return _var_impl(x, dim, _correction(unbiased, correction), keepdim)


@register_handler(torch.std, torch.Tensor.std)
def _std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    v = _var_impl(x, dim, _correction(unbiased, correction), keepdim)
    return wrap(torch.sqrt(v._local), v._spec)


def _vector_norm(x, ord, dim, keepdim):
    x = reduce_partials(x)
    spec = x._spec
    dims = _norm_dims(dim, spec.ndim)
    out_spec = _out_spec(spec, dims, keepdim, Replicate())
    local = x._local
    if not _sharded_mesh_dims(spec, dims):
        return wrap(torch.linalg.vector_norm(local, ord, dims, keepdim), out_spec)
    a = local.abs()
    if ord in (math.inf, float("inf")):
        return _amax_amin(wrap(a, spec), dims, keepdim, "max")
    if ord in (-math.inf, float("-inf")):
        return _amax_amin(wrap(a, spec), dims, keepdim, "min")
    if ord == 0:
        s = _global_sum((a != 0).to(local.dtype), dims, keepdim, spec)
        return wrap(s, out_spec)
    if ord == 2:
        s = _global_sum(a * a, dims, keepdim, spec)
        return wrap(torch.sqrt(s), out_spec)
    if ord == 1:
        return wrap(_global_sum(a, dims, keepdim, spec), out_spec)
    s = _global_sum(a**ord, dims, keepdim, spec)
    return wrap(s ** (1.0 / ord), out_spec)


@register_handler(torch.linalg.vector_norm)
def _linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(x, ord, dim, keepdim)


@register_handler(torch.norm, torch.Tensor.norm)
def _norm(x, p="fro", dim=None, keepdim=False, dtype=None):
    if p == "fro" or p is None:
        p = 2
    if isinstance(p, str):
        msg = f"ShardTensor norm supports vector norms (p a number or 'fro'), got p={p!r}"
        raise NotImplementedError(msg)
    return _vector_norm(x, p, dim, keepdim)


@register_handler(torch.logsumexp, torch.Tensor.logsumexp)
def _logsumexp(x, dim, keepdim=False):
    x = reduce_partials(x)
    spec = x._spec
    dims = _norm_dims(dim, spec.ndim)
    out_spec = _out_spec(spec, dims, keepdim, Replicate())
    if not _sharded_mesh_dims(spec, dims):
        return wrap(torch.logsumexp(x._local, dims, keepdim), out_spec)
    m = _extreme_local(x._local.detach(), dims, True, "max")
    for i in _sharded_mesh_dims(spec, dims):
        m = C.all_reduce(m, "max", mesh_group(spec.mesh, i))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = _global_sum(torch.exp(x._local - m), dims, True, spec)
    out = torch.log(s) + m
    if not keepdim:
        out = out.squeeze(dims) if dims else out
    return wrap(out, out_spec)


__all__ = ["ShardTensor"]
