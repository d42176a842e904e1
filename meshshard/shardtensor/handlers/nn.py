"""softmax / log_softmax, layer_norm, group_norm, normalize, scaled_dot_product_attention, and
dim-wise ops (cumsum, sort, topk) along unsharded dims."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard

from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._dispatch import (
    LayoutError,
    check_same_mesh,
    reduce_partials,
    replicated_local,
    wrap,
)
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.handlers.reductions import _extreme_local
from meshshard.shardtensor.registry import register_handler
from meshshard.shardtensor.spec import ShardSpec


def _dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def _mesh_dim_sharding(spec: ShardSpec, d: int):
    return spec.mesh_dim_of(d)


def _softmax_impl(x, dim, log: bool, dtype=None):
    x = reduce_partials(x)
    spec = x._spec
    d = _dim(dim, spec.ndim)
    local = x._local if dtype is None else x._local.to(dtype)
    i = _mesh_dim_sharding(spec, d)
    if i is None:
        f = F.log_softmax if log else F.softmax
        return wrap(f(local, dim=d), spec)
    group = spec.mesh.get_group(i)
    m = _extreme_local(local.detach(), (d,), True, "max")
    m = C.all_reduce(m, "max", group)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    z = local - m
    # s meets local rows below: its gradient is summed over ranks (grad_all_reduce)
    s = C.grad_all_reduce(C.all_reduce(torch.exp(z).sum(dim=d, keepdim=True), "sum", group),
                          [group])
    out = z - torch.log(s) if log else torch.exp(z) / s
    return wrap(out, spec)


def _softmax_handler(log):
    def handler(x, dim=None, _stacklevel=3, dtype=None, **kw):
        if dim is None:
            msg = "softmax on a ShardTensor needs an explicit dim"
            raise ValueError(msg)
        return _softmax_impl(x, dim, log, dtype)

    return handler


register_handler(F.softmax, torch.softmax, torch.Tensor.softmax)(_softmax_handler(False))
register_handler(F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax)(
    _softmax_handler(True)
)


def _global_stats(local, dims, spec, mesh_dims):
    """Mean and biased variance over ``dims`` with global counts (differentiable). Both meet
    local rows afterwards, so their gradients are summed over the ranks."""
    n = math.prod(spec.shape[d] for d in dims)
    groups = [spec.mesh.get_group(i) for i in mesh_dims]
    s = local.sum(dim=dims, keepdim=True)
    for g in groups:
        s = C.all_reduce(s, "sum", g)
    mean = C.grad_all_reduce(s / n, groups)
    v = ((local - mean) ** 2).sum(dim=dims, keepdim=True)
    for g in groups:
        v = C.all_reduce(v, "sum", g)
    return mean, C.grad_all_reduce(v / n, groups)


@register_handler(F.layer_norm)
def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    x = reduce_partials(x)
    spec = x._spec
    k = len(normalized_shape)
    dims = tuple(range(spec.ndim - k, spec.ndim))
    mesh_dims = [i for i, p in enumerate(spec.placements) if isinstance(p, Shard) and p.dim in dims]
    aligned = {i: p.dim - (spec.ndim - k) for i, p in enumerate(spec.placements)
               if isinstance(p, Shard) and p.dim in dims}
    w = None if weight is None else replicated_local(weight, spec, aligned)
    b = None if bias is None else replicated_local(bias, spec, aligned)
    if not mesh_dims:
        return wrap(F.layer_norm(x._local, normalized_shape, w, b, eps), spec)
    mean, var = _global_stats(x._local, dims, spec, mesh_dims)
    y = (x._local - mean) / torch.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return wrap(y, spec)


@register_handler(F.group_norm)
def _group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    x = reduce_partials(x)
    spec = x._spec
    if spec.ndim < 2:
        msg = "group_norm needs input of shape (N, C, *)"
        raise ValueError(msg)
    if spec.mesh_dim_of(1) is not None:
        msg = "group_norm with the channel dim sharded is not supported: redistribute channels"
        raise LayoutError(msg)
    mesh_dims = [i for i, p in enumerate(spec.placements) if isinstance(p, Shard) and p.dim >= 2]
    shape_c = [1] * spec.ndim
    shape_c[1] = spec.shape[1]
    w = None if weight is None else replicated_local(weight, spec, {})
    b = None if bias is None else replicated_local(bias, spec, {})
    if not mesh_dims:
        return wrap(F.group_norm(x._local, num_groups, w, b, eps), spec)
    local = x._local
    n_loc, c = local.shape[0], local.shape[1]
    rest = local.shape[2:]
    g = local.reshape(n_loc, num_groups, c // num_groups, *rest)
    gspec_shape = (spec.shape[0], num_groups, c // num_groups, *spec.shape[2:])
    gspec = ShardSpec(
        spec.mesh,
        tuple(Shard(p.dim + 1) if isinstance(p, Shard) and p.dim >= 2 else p
              for p in spec.placements),
        spec.sizes,
        torch.Size(gspec_shape),
    )
    dims = tuple(range(2, g.ndim))
    mean, var = _global_stats(g, dims, gspec, mesh_dims)
    y = ((g - mean) / torch.sqrt(var + eps)).reshape(local.shape)
    if w is not None:
        y = y * w.reshape(shape_c)
    if b is not None:
        y = y + b.reshape(shape_c)
    return wrap(y, spec)


@register_handler(F.normalize)
def _normalize(x, p=2.0, dim=1, eps=1e-12, out=None):
    x = reduce_partials(x)
    spec = x._spec
    d = _dim(dim, spec.ndim)
    if spec.mesh_dim_of(d) is None:
        return wrap(F.normalize(x._local, p=p, dim=d, eps=eps), spec)
    n = torch.linalg.vector_norm(x, p, d, keepdim=True)
    return x / n.clamp_min(eps)


@register_handler(F.scaled_dot_product_attention)
def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """Replicated q/k/v: computed locally. Query rows sharded (any dim but the last), keys and
    values replicated: each rank attends its queries to all keys (exact). Keys sharded along
    the sequence: not supported (would need ring attention) -> clear error."""
    ops = [t for t in (query, key, value, attn_mask) if isinstance(t, ShardTensor)]
    mesh = check_same_mesh(ops)
    query, key, value = (reduce_partials(t) if isinstance(t, ShardTensor) else t
                         for t in (query, key, value))
    qspec = query._spec if isinstance(query, ShardTensor) else None
    nd = len(query.shape)
    for t, nm in ((key, "key"), (value, "value")):
        if isinstance(t, ShardTensor):
            for i, p in enumerate(t._spec.placements):
                if isinstance(p, Shard):
                    qp = qspec.placements[i] if qspec else Replicate()
                    if p.dim >= nd - 2 or qp != p or qspec.sizes[i] != t._spec.sizes[i]:
                        msg = (
                            f"scaled_dot_product_attention: {nm} is sharded along dim {p.dim}; "
                            "keys/values must be replicated (or sharded like the query on a "
                            "batch/head dim). Redistribute them with .redistribute([Replicate()])"
                        )
                        raise LayoutError(msg)
    if qspec is None:
        qspec = ShardSpec(mesh, tuple(Replicate() for _ in range(mesh.ndim)),
                          (None,) * mesh.ndim, torch.Size(query.shape))
    if is_causal and any(isinstance(p, Shard) and p.dim == nd - 2 for p in qspec.placements):
        msg = "is_causal with query rows sharded is not supported; pass an explicit attn_mask"
        raise NotImplementedError(msg)
    ql = query._local if isinstance(query, ShardTensor) else query
    kl = replicated_local(key, qspec, {}) if not (isinstance(key, ShardTensor) and not
                                                   key._spec.is_replicated()) else key._local
    vl = replicated_local(value, qspec, {}) if not (isinstance(value, ShardTensor) and not
                                                     value._spec.is_replicated()) else value._local
    ml = attn_mask
    if isinstance(attn_mask, ShardTensor):
        ml = attn_mask._local
    out = F.scaled_dot_product_attention(
        ql, kl, vl, attn_mask=ml, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw
    )
    oshape = list(qspec.shape)
    oshape[-1] = value.shape[-1]
    return wrap(out, qspec.with_changes(shape=torch.Size(oshape)))


def _dimwise(fn, name, shape_fn=None):
    """Ops acting independently along ``dim``: fine when that dim is not sharded."""

    def handler(x, dim=-1, *args, **kwargs):
        x = reduce_partials(x)
        spec = x._spec
        d = _dim(dim, spec.ndim)
        if spec.mesh_dim_of(d) is not None:
            msg = (
                f"{name} along the sharded dim {d} is not supported; redistribute that dim to "
                "Replicate first, or shard another dim"
            )
            raise LayoutError(msg)
        out = fn(x._local, d, *args, **kwargs)

        def spec_of(o):
            shape = list(spec.shape)
            shape[d] = o.shape[d]
            return spec.with_changes(shape=torch.Size(shape))

        if isinstance(out, torch.Tensor):
            return wrap(out, spec_of(out))
        return type(out)(tuple(wrap(o, spec_of(o)) for o in out))

    return handler


register_handler(torch.cumsum, torch.Tensor.cumsum)(
    _dimwise(lambda t, d, *a, **k: torch.cumsum(t, d, *a, **k), "cumsum")
)
register_handler(torch.cumprod, torch.Tensor.cumprod)(
    _dimwise(lambda t, d, *a, **k: torch.cumprod(t, d, *a, **k), "cumprod")
)
register_handler(torch.sort, torch.Tensor.sort)(
    _dimwise(lambda t, d, *a, **k: torch.sort(t, d, *a, **k), "sort")
)
register_handler(torch.argsort, torch.Tensor.argsort)(
    _dimwise(lambda t, d, *a, **k: torch.argsort(t, d, *a, **k), "argsort")
)


@register_handler(torch.topk, torch.Tensor.topk)
def _topk(x, k, dim=-1, largest=True, sorted=True):
    return _dimwise(lambda t, d: torch.topk(t, k, d, largest, sorted), "topk")(x, dim)
