"""F.interpolate (nearest, linear, bilinear, trilinear; align_corners both ways; size or
scale_factor) on tensors sharded along spatial dims.

The resampling is separable: along each spatial dim, output ``t`` reads input rows ``i0(t)``
and ``i1(t)`` with weights computed from global positions by torch's own float32 formulas
(``area_pixel_compute_source_index``, ``nearest_idx``), so shards see exactly the coordinates
one process would. Output ``t`` belongs to the owner of ``i0(t)``; the rows it reads from other
ranks arrive by halo exchange.
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from meshshard.shardtensor._layout import reduce_partials, wrap
from meshshard.shardtensor._tracemode import constant
from meshshard.shardtensor.handlers.grid._window import (
    DimPlan,
    empty_like_out,
    gather_windows,
    out_sizes_of,
    out_spec,
    ranges_of,
    sharded_spatial,
)
from meshshard.shardtensor.handlers.grid.conv import meta_of, needs_rule
from meshshard.shardtensor.registry import register_handler

_LINEAR = {"linear", "bilinear", "trilinear"}


def source_rows(n: int, m: int, mode: str, align_corners: bool, scale: float | None):
    """(i0, i1, lambda1) for every output of one dim, as torch's CPU kernels compute them."""
    f32 = np.float32
    t = np.arange(m, dtype=np.int64)
    if mode == "nearest":
        if m == n:
            i0 = t
        elif m == 2 * n:
            i0 = t >> 1
        else:
            sc = f32(1.0 / scale) if scale is not None else f32(n) / f32(m)
            i0 = np.minimum(np.floor(t.astype(f32) * sc).astype(np.int64), n - 1)
        return i0, i0, np.zeros(m, dtype=np.float32)
    if m == n:
        return t, t, np.zeros(m, dtype=np.float32)
    if align_corners:
        sc = f32(n - 1) / f32(m - 1) if m > 1 else f32(0)
        src = sc * t.astype(f32)
    else:
        sc = f32(1.0 / scale) if scale is not None else f32(n) / f32(m)
        src = sc * (t.astype(f32) + f32(0.5)) - f32(0.5)
        src = np.where(src < 0, f32(0), src).astype(f32)
    i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
    lam = np.clip(src - i0.astype(f32), f32(0), f32(1)).astype(np.float32)
    i1 = i0 + (i0 < n - 1)
    return i0, i1, lam


def _resample(x, d, i0, i1, lam):
    dev = x.device
    a = x.index_select(d, constant(i0, device=dev))
    if not np.any(lam):
        return a
    b = x.index_select(d, constant(i1, device=dev))
    shape = [1] * x.ndim
    shape[d] = -1
    w1 = constant(lam, device=dev).to(x.dtype).view(shape)
    return a * (1 - w1) + b * w1


@register_handler(F.interpolate)
def _interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False):
    kw = {"size": size, "scale_factor": scale_factor, "mode": mode,
          "align_corners": align_corners, "recompute_scale_factor": recompute_scale_factor,
          "antialias": antialias}
    r = needs_rule(F.interpolate, input, (), (input,), kw)
    if r is not None:
        return r
    x = reduce_partials(input)
    spec = x._spec
    gout = F.interpolate(meta_of(x), **kw)  # torch's checks on the global shapes
    nsp = spec.ndim - 2
    sharded = sharded_spatial(spec, nsp, "interpolate")
    if not sharded:
        return wrap(F.interpolate(x._local, **kw), spec.with_changes(shape=gout.shape))
    if (mode != "nearest" and mode not in _LINEAR) or antialias:
        msg = (f"interpolate mode={mode!r} (antialias={antialias}) on a tensor sharded along a "
               "spatial dim is not supported: use nearest/linear/bilinear/trilinear")
        raise NotImplementedError(msg)
    scales = [None] * nsp
    if scale_factor is not None and not recompute_scale_factor:
        sf = scale_factor if isinstance(scale_factor, (tuple, list)) else [scale_factor] * nsp
        scales = [float(v) for v in sf]
    rows, plans = {}, []
    for a in range(nsp):
        d = 2 + a
        n, m = int(spec.shape[d]), int(gout.shape[d])
        i0, i1, lam = source_rows(n, m, mode, bool(align_corners), scales[a])
        if d not in sharded:
            rows[d] = (i0, i1, lam)
            continue
        i = sharded[d]
        out_sizes = out_sizes_of(i0, spec.sizes[i])
        needs, starts = [], []
        for t0, t1 in ranges_of(out_sizes):
            lo = int(i0[t0]) if t1 > t0 else 0
            hi = int(i1[t0:t1].max()) + 1 if t1 > t0 else 0
            needs.append(tuple(range(lo, hi)))
            starts.append(lo)
        plans.append(DimPlan(d, i, out_sizes, tuple(needs)))
        me = spec.mesh.get_local_rank(i)
        t0, t1 = ranges_of(out_sizes)[me]
        s0 = starts[me]
        rows[d] = (i0[t0:t1] - s0, i1[t0:t1] - s0, lam[t0:t1])
    so = out_spec(spec, gout.shape, plans)
    win = gather_windows(x._local, spec, plans)
    oshape = so.local_shape()
    if any(v == 0 for v in oshape):
        return wrap(empty_like_out(oshape, win, (win,)), so)
    out = win
    for d, (i0, i1, lam) in rows.items():
        out = _resample(out, d, i0, i1, lam)
    return wrap(out, so)
