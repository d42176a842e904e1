"""batch_norm and instance_norm over sharded spatial (and batch) dims with global statistics.

Training statistics are global sums over every rank, in one fused autograd node that saves only
the input (``_globalnorm``);
running statistics are updated in place with the global mean and the unbiased global variance,
exactly as one process would, so every rank holds the same buffers. In eval mode the running
statistics are used and no data moves. ``layer_norm`` and ``group_norm`` over sharded spatial
dims are rules in ``handlers/nn.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Shard

from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._layout import reduce_partials, replicated_local, wrap
from meshshard.shardtensor.handlers.grid._globalnorm import global_norm
from meshshard.shardtensor.handlers.grid._window import sharded_spatial
from meshshard.shardtensor.handlers.grid.conv import needs_rule
from meshshard.shardtensor.registry import register_handler


def _affine(y, weight, bias, spec):
    w, b = _wb(weight, bias, spec)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def _wb(weight, bias, spec):
    """Local weight/bias reshaped to (1, C, 1, ...) (gradients summed over the ranks)."""
    shape_c = [1] * spec.ndim
    shape_c[1] = spec.shape[1]
    w = None if weight is None else replicated_local(weight, spec, {}).reshape(shape_c)
    b = None if bias is None else replicated_local(bias, spec, {}).reshape(shape_c)
    return w, b


def _with_running(local, rm, rv, eps, spec):
    shape_c = [1] * spec.ndim
    shape_c[1] = spec.shape[1]
    return (local - rm.reshape(shape_c)) / torch.sqrt(rv.reshape(shape_c) + eps)


def _update(buf, value, momentum):
    if buf is not None:
        with torch.no_grad():
            buf.mul_(1 - momentum).add_(value.detach().reshape(buf.shape).to(buf.dtype),
                                        alpha=momentum)


@register_handler(F.batch_norm)
def _batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
                momentum=0.1, eps=1e-5):
    args = (input, running_mean, running_var, weight, bias, training, momentum, eps)
    r = needs_rule(F.batch_norm, input, (weight, bias), args, {})
    if r is not None:
        return r
    x = reduce_partials(input)
    spec = x._spec
    sharded_spatial(spec, spec.ndim - 2, "batch_norm")  # channel sharding -> clear error
    if not training:
        if running_mean is None or running_var is None:
            msg = "batch_norm in eval mode needs running_mean and running_var"
            raise ValueError(msg)
        y = _with_running(x._local, running_mean, running_var, eps, spec)
        return wrap(_affine(y, weight, bias, spec), spec)
    dims = (0, *range(2, spec.ndim))
    mesh_dims = [i for i, p in enumerate(spec.placements) if isinstance(p, Shard)]
    n = math.prod(spec.shape[d] for d in dims)
    w, b = _wb(weight, bias, spec)
    groups = [spec.mesh.get_group(i) for i in mesh_dims]
    y, mean, var = global_norm(x._local, dims, groups, n, eps, w, b)
    _update(running_mean, mean, momentum)
    if running_var is not None:
        _update(running_var, var * (n / max(n - 1, 1)), momentum)
    return wrap(y, spec)


@register_handler(F.instance_norm)
def _instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                   use_input_stats=True, momentum=0.1, eps=1e-5):
    args = (input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
    r = needs_rule(F.instance_norm, input, (weight, bias), args, {})
    if r is not None:
        return r
    x = reduce_partials(input)
    spec = x._spec
    sharded = sharded_spatial(spec, spec.ndim - 2, "instance_norm")
    if not use_input_stats:
        y = _with_running(x._local, running_mean, running_var, eps, spec)
        return wrap(_affine(y, weight, bias, spec), spec)
    dims = tuple(range(2, spec.ndim))
    n = math.prod(spec.shape[d] for d in dims)
    w, b = _wb(weight, bias, spec)
    groups = [spec.mesh.get_group(i) for i in sharded.values()]
    y, mean, var = global_norm(x._local, dims, groups, n, eps, w, b)
    if running_mean is not None or running_var is not None:
        # buffers follow the mean over the (global) batch of the per-instance statistics
        with torch.no_grad():
            stats = torch.stack([mean.detach().sum(0).flatten(),
                                 (var.detach() * (n / max(n - 1, 1))).sum(0).flatten()])
            bdim = spec.mesh_dim_of(0)
            if bdim is not None:
                stats = C.all_reduce(stats, "sum", spec.mesh.get_group(bdim))
            stats = stats / spec.shape[0]
        _update(running_mean, stats[0], momentum)
        _update(running_var, stats[1], momentum)
    return wrap(y, spec)
