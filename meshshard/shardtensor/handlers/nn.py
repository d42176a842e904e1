"""softmax / log_softmax, layer_norm, group_norm, normalize, and dim-wise ops (cumsum, sort,
topk) along unsharded dims. Attention lives in :mod:`.attention`."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Shard

from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._layout import LayoutError, reduce_partials, replicated_local, wrap
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.handlers.grid._globalnorm import global_norm
from meshshard.shardtensor.handlers.reductions import _extreme_local
from meshshard.shardtensor.registry import register_handler
from meshshard.shardtensor.spec import ShardSpec, mesh_group


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
    group = mesh_group(spec.mesh, i)
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
    groups = [mesh_group(spec.mesh, i) for i in mesh_dims]
    s = local.sum(dim=dims, keepdim=True)
    for g in groups:
        s = C.all_reduce(s, "sum", g)
    mean = C.grad_all_reduce(s / n, groups)
    v = ((local - mean) ** 2).sum(dim=dims, keepdim=True)
    for g in groups:
        v = C.all_reduce(v, "sum", g)
    return mean, C.grad_all_reduce(v / n, groups)


def _rowlocal_groups(spec: ShardSpec, k: int):
    """Groups over the non-replicated mesh dims of ``spec`` (no Partial), or None if one of the
    last ``k`` dims is sharded."""
    nd = spec.ndim
    for p in spec.placements:
        if isinstance(p, Shard) and p.dim >= nd - k:
            return None
    return [mesh_group(spec.mesh, i) for i, p in enumerate(spec.placements)
            if isinstance(p, Shard)]


@register_handler(F.layer_norm)
def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    x = reduce_partials(x)
    spec = x._spec
    if not isinstance(weight, ShardTensor) and not isinstance(bias, ShardTensor):
        # the common case, decided once per input layout: no normalized dim is sharded, so
        # it runs locally; weight and bias get their gradients summed over the sharded mesh dims
        k = len(normalized_shape)
        groups = spec.derived(("layer_norm", k), lambda: _rowlocal_groups(spec, k))
        if groups is not None:
            w = weight if weight is None or not groups else C.grad_all_reduce(weight, groups)
            b = bias if bias is None or not groups else C.grad_all_reduce(bias, groups)
            return wrap(F.layer_norm(x._local, normalized_shape, w, b, eps), spec)
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
    w = None if weight is None else replicated_local(weight, spec, {})
    b = None if bias is None else replicated_local(bias, spec, {})
    if not mesh_dims:
        return wrap(F.group_norm(x._local, num_groups, w, b, eps), spec)
    local = x._local
    n_loc, c = local.shape[0], local.shape[1]
    g = local.reshape(n_loc, num_groups, c // num_groups, *local.shape[2:])
    dims = tuple(range(2, g.ndim))
    n = (c // num_groups) * math.prod(spec.shape[2:])
    gshape = [1] * g.ndim
    gshape[1], gshape[2] = num_groups, c // num_groups
    groups = [mesh_group(spec.mesh, i) for i in mesh_dims]
    y, _, _ = global_norm(g, dims, groups, n, eps, None if w is None else w.reshape(gshape),
                          None if b is None else b.reshape(gshape))
    y = y.reshape(local.shape)
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
