"""max_pool / avg_pool (1-3-D, padding, dilation, ceil_mode) and adaptive pooling (output
sizes dividing the sharded dims) on tensors sharded along spatial dims.

Windows are fetched like a convolution's (``_window``); rows outside the grid are -inf for max
pooling and 0 for average pooling, whose divisor is then corrected to torch's own
(``count_include_pad``, ceil-mode overhang) from global positions.
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from meshshard.shardtensor._layout import reduce_partials, wrap
from meshshard.shardtensor._tracemode import constant
from meshshard.shardtensor.handlers.grid._window import (
    empty_like_out,
    gather_windows,
    out_spec,
    sharded_spatial,
    sliding_plan,
    tuple_arg,
)
from meshshard.shardtensor.handlers.grid.conv import meta_of, needs_rule
from meshshard.shardtensor.registry import register_handler

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _windows(x, nd, name, gshape, k, s, dl, p, fill):
    spec = x._spec
    sharded = sharded_spatial(spec, nd, name)
    first = spec.ndim - nd
    plans = []
    for d in sorted(sharded):
        a = d - first
        plans.append(sliding_plan(d, sharded[d], spec.sizes[sharded[d]], gshape[d], k[a], s[a],
                                  dl[a], p[a]))
    so = out_spec(spec, gshape, plans)
    win = gather_windows(x._local, spec, plans, fill=fill)
    local_p = tuple(0 if first + a in sharded else p[a] for a in range(nd))
    return win, so, sharded, local_p


def _max_rule(nd):
    func = _MAX[nd]

    def handler(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                return_indices=False):
        kw = {"stride": stride, "padding": padding, "dilation": dilation,
              "ceil_mode": ceil_mode, "return_indices": return_indices}
        r = needs_rule(func, input, (), (input, kernel_size), kw)
        if r is not None:
            return r
        x = reduce_partials(input)
        gout = func(meta_of(x), kernel_size, **kw)
        if return_indices:
            msg = (f"max_pool{nd}d(return_indices=True) on a tensor sharded along a spatial dim "
                   "is not supported (indices would be local); use return_indices=False")
            raise NotImplementedError(msg)
        k = tuple_arg(kernel_size, nd, "kernel_size")
        s = k if stride is None or stride == [] else tuple_arg(stride, nd, "stride")
        dl = tuple_arg(dilation, nd, "dilation")
        p = tuple_arg(padding, nd, "padding")
        win, so, _, lp = _windows(x, nd, f"max_pool{nd}d", gout.shape, k, s, dl, p,
                                  float("-inf"))
        oshape = so.local_shape()
        if any(v == 0 for v in oshape):
            return wrap(empty_like_out(oshape, win, (win,)), so)
        return wrap(func(win, k, s, lp, dl, ceil_mode=ceil_mode), so)

    return handler


def divisors(n: int, m: int, k: int, s: int, p: int, include_pad: bool) -> np.ndarray:
    """torch's average-pool divisor along one dim for each of the ``m`` outputs."""
    start = np.arange(m) * s - p
    end = np.minimum(start + k, n + p)
    if include_pad:
        return (end - start).astype(np.float64)
    return (np.minimum(end, n) - np.maximum(start, 0)).astype(np.float64)


def _avg_rule(nd):
    func = _AVG[nd]

    def handler(input, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
        extra = () if nd == 1 else (divisor_override,)
        s_arg = kernel_size if stride is None else stride
        args = (input, kernel_size, s_arg, padding, ceil_mode, count_include_pad, *extra)
        r = needs_rule(func, input, (), args, {})
        if r is not None:
            return r
        x = reduce_partials(input)
        gout = func(meta_of(x), *args[1:])
        k = tuple_arg(kernel_size, nd, "kernel_size")
        s = tuple_arg(s_arg, nd, "stride")
        p = tuple_arg(padding, nd, "padding")
        win, so, sharded, lp = _windows(x, nd, f"avg_pool{nd}d", gout.shape, k, s, (1,) * nd,
                                        p, 0.0)
        oshape = so.local_shape()
        if any(v == 0 for v in oshape):
            return wrap(empty_like_out(oshape, win, (win,)), so)
        out = func(win, k, s, lp, ceil_mode, count_include_pad, *extra)
        if divisor_override is None:
            first = so.ndim - nd
            for d in sharded:
                a = d - first
                n = int(x._spec.shape[d])
                div = divisors(n, int(gout.shape[d]), k[a], s[a], p[a], count_include_pad)
                off = so.offset(d)
                fac = k[a] / div[off : off + oshape[d]]
                shape = [1] * out.ndim
                shape[d] = -1
                out = out * constant(fac, dtype=out.dtype, device=out.device).view(shape)
        return wrap(out, so)

    return handler


def _adaptive_rule(nd, kind):
    func = getattr(F, f"adaptive_{kind}_pool{nd}d")
    pool = _MAX[nd] if kind == "max" else _AVG[nd]

    def handler(input, output_size, return_indices=False):
        kw = {"return_indices": return_indices} if kind == "max" else {}
        r = needs_rule(func, input, (), (input, output_size), kw)
        if r is not None:
            return r
        x = reduce_partials(input)
        spec = x._spec
        gout = func(meta_of(x), output_size, **kw)
        if return_indices:
            msg = f"adaptive_max_pool{nd}d(return_indices=True) on a sharded grid: unsupported"
            raise NotImplementedError(msg)
        sharded = sharded_spatial(spec, nd, func.__name__)
        first = spec.ndim - nd
        k = [1] * nd
        for d in sharded:
            n, m = int(spec.shape[d]), int(gout.shape[d])
            if m == 0 or n % m:
                msg = (f"{func.__name__}: output size {m} does not divide the sharded dim {d} of "
                       f"size {n}; choose an output size that divides it (or replicate the dim)")
                raise NotImplementedError(msg)
            k[d - first] = n // m
        y = pool(x, tuple(k), tuple(k)) if any(v > 1 for v in k) else x
        so = y._spec.with_changes(shape=gout.shape)
        oshape = so.local_shape()
        if any(v == 0 for v in oshape):
            return wrap(empty_like_out(oshape, y._local, (y._local,)), so)
        local_size = tuple(oshape[first:])
        out = func(y._local, local_size)
        return wrap(out, so)

    return handler


def _with_indices(nd):
    rule = _max_rule(nd)

    def handler(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                return_indices=True):
        return rule(input, kernel_size, stride, padding, dilation, ceil_mode, True)

    return handler


for _nd in (1, 2, 3):
    register_handler(_MAX[_nd])(_max_rule(_nd))
    register_handler(getattr(F, f"max_pool{_nd}d_with_indices"))(_with_indices(_nd))
    register_handler(_AVG[_nd])(_avg_rule(_nd))
    register_handler(getattr(F, f"adaptive_avg_pool{_nd}d"))(_adaptive_rule(_nd, "avg"))
    register_handler(getattr(F, f"adaptive_max_pool{_nd}d"))(_adaptive_rule(_nd, "max"))
