"""Aten rules for ``upsample_nearest{1,2,3}d`` and ``upsample_{linear1d,bilinear2d,
trilinear3d}`` (+ backward) on sharded grids.

The resampling is separable: along each spatial dim, output ``t`` reads input rows ``i0(t)``
and ``i1(t)`` with weights from global positions, computed as torch's CPU kernels compute
them (float32 coordinates for float32 and lower, float64 for float64). Output ``t`` belongs to
the owner of ``i0(t)``; the rows it reads from other ranks arrive by halo exchange.

The backward ops get the input's *size* only, not its layout. The input layout is recovered
from the output's: input row ``i`` goes with the first output reading it as ``i0``. That is
the forward's layout whenever every input row is some output's ``i0`` (any upsampling); for a
downsampling it is still a valid layout, and the gradient is converted where it is consumed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.distributed.tensor import Shard

from meshshard.shardtensor._aten.grid_halo import tie
from meshshard.shardtensor._aten.grid_plan import DimPlan, out_sizes_of, ranges_of
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import ShardTensor, make_spec
from meshshard.shardtensor.rules import grid_conv as rg

aten = torch.ops.aten


def source_rows(n, m, linear, align, scale, f64):
    """(i0, i1, lambda1) for the ``m`` outputs of one dim of size ``n``."""
    t = np.arange(m, dtype=np.int64)
    if not linear:
        f32 = np.float32
        if m == n:
            i0 = t
        elif m == 2 * n:
            i0 = t >> 1
        else:
            sc = f32(1.0 / scale) if scale else f32(n) / f32(m)
            i0 = np.minimum(np.floor(t.astype(f32) * sc).astype(np.int64), n - 1)
        return i0, i0, None
    f = np.float64 if f64 else np.float32
    if align:
        sc = f(n - 1) / f(m - 1) if m > 1 else f(0)
        src = sc * t.astype(f)
    else:
        sc = f(1.0 / scale) if scale else f(n) / f(m)
        src = np.maximum(sc * (t.astype(f) + f(0.5)) - f(0.5), f(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
    lam = np.clip(src - i0.astype(f), f(0), f(1))
    i1 = i0 + (i0 < n - 1)
    return i0, i1, lam


def _plan(spec, x_shape, osz, linear, align, scales, f64, in_sizes=None):
    """Per spatial dim (i0, i1, lam) in window coordinates; plans; output spec."""
    nsp = len(osz)
    first = len(x_shape) - nsp
    sharded = {p.dim: i for i, p in enumerate(spec.placements)
               if isinstance(p, Shard) and p.dim >= first}
    rows, plans = {}, []
    for a in range(nsp):
        d = first + a
        n, m = int(x_shape[d]), int(osz[a])
        i0, i1, lam = source_rows(n, m, linear, align, scales[a], f64)
        if d not in sharded:
            rows[d] = (i0, i1, lam)
            continue
        i = sharded[d]
        sizes = in_sizes[i] if in_sizes is not None else rg.ints(spec.sizes[i])
        out_sizes = out_sizes_of(i0, sizes)
        needs, starts = [], []
        for t0, t1 in ranges_of(out_sizes):
            lo = int(i0[t0]) if t1 > t0 else 0
            hi = int(i1[t0:t1].max()) + 1 if t1 > t0 else 0
            needs.append(tuple(range(lo, hi)))
            starts.append(lo)
        plans.append(DimPlan(d, i, out_sizes, tuple(needs)))
        t0, t1 = ranges_of(out_sizes)[rg.me_of(spec, i)]
        s0 = starts[rg.me_of(spec, i)]
        rows[d] = (i0[t0:t1] - s0, i1[t0:t1] - s0, None if lam is None else lam[t0:t1])
    return rows, plans, sharded


def _input_sizes(out_sizes, i0, n):
    """A layout of the input rows matching an output layout: row ``i`` goes with the first
    output ``t`` whose ``i0(t) >= i`` (the last non-empty rank if none)."""
    owners = np.zeros(n, dtype=np.int64)
    ends = np.cumsum(out_sizes)
    first_t = np.searchsorted(i0, np.arange(n), side="left")
    last = int(np.flatnonzero(np.asarray(out_sizes) > 0)[-1]) if any(out_sizes) else 0
    for i, t in enumerate(first_t.tolist()):
        owners[i] = int(np.searchsorted(ends, t, side="right")) if t < len(i0) else last
    return tuple(int(v) for v in np.bincount(owners, minlength=len(out_sizes)))


def _consts(idx, lam, like):
    i = torch.tensor(idx, dtype=torch.long, device=like.device)
    w = None if lam is None or not np.any(lam) else torch.tensor(lam, device=like.device).to(
        like.dtype)
    return i, w


def _resample(x, rows):
    for d, (i0, i1, lam) in rows.items():
        a, w = _consts(i0, lam, x)
        y = x.index_select(d, a)
        if w is not None:
            shape = [1] * x.ndim
            shape[d] = -1
            b, _ = _consts(i1, None, x)
            w = w.reshape(shape)
            y = y * (1 - w) + x.index_select(d, b) * w
        x = y
    return x


def _resample_transpose(g, rows, in_shape):
    shape = list(g.shape)
    for d, (i0, i1, lam) in reversed(list(rows.items())):
        shape[d] = in_shape[d]
        a, w = _consts(i0, lam, g)
        if w is None:
            g = g.new_zeros(shape).index_add(d, a, g)
            continue
        ws = [1] * g.ndim
        ws[d] = -1
        w = w.reshape(ws)
        b, _ = _consts(i1, None, g)
        g = g.new_zeros(shape).index_add(d, a, g * (1 - w)).index_add(d, b, g * w)
    return g


def _args(args, nsp, linear):
    osz = [int(v) for v in args[1]]
    align = bool(args[2]) if linear else False
    rest = list(args[3 if linear else 2:]) + [None] * nsp
    return osz, align, [None if v is None or v <= 0 else float(v) for v in rest[:nsp]]


def _upsample(name, nsp, linear):
    @register_rule(getattr(aten, name).default, direct=True)
    def fwd(func, args, kwargs):
        x = args[0]
        osz, align, scales = _args(args, nsp, linear)
        local, spec, _ = rg.grid_input(x, nsp, str(func))
        rows, plans, sharded = _plan(spec, rg.ints(x.shape), osz, linear, align, scales,
                                     local.dtype == torch.float64)
        shape = [*rg.ints(x.shape[: x.ndim - nsp]), *osz]
        so = rg.out_spec(spec, shape, plans)
        exs = rg.exchanges(spec, plans)
        win = rg.gather(local, spec, exs)
        oshape = rg.local_shape(so)
        if any(v == 0 for v in oshape) or any(win.shape[d] == 0 for d in sharded):
            return ShardTensor(tie(win.new_zeros(oshape), win), so)
        return ShardTensor(_resample(win, rows), so)

    @register_rule(getattr(aten, f"{name}_backward").default, direct=True)
    def bwd(func, args, kwargs):
        g = args[0]
        osz, in_size = [int(v) for v in args[1]], [int(v) for v in args[2]]
        align = bool(args[3]) if linear else False
        rest = list(args[4 if linear else 3:]) + [None] * nsp
        scales = [None if v is None or v <= 0 else float(v) for v in rest[:nsp]]
        gs = g._spec
        first = len(in_size) - nsp
        f64 = g._local.dtype == torch.float64
        in_sizes = list(gs.sizes)
        for i, p in enumerate(gs.placements):
            if isinstance(p, Shard) and p.dim >= first:
                i0, _, _ = source_rows(in_size[p.dim], osz[p.dim - first], linear, align,
                                       scales[p.dim - first], f64)
                in_sizes[i] = _input_sizes(rg.ints(gs.sizes[i]), i0, in_size[p.dim])
        spec = make_spec(gs.mesh, gs.placements, tuple(in_sizes), tuple(in_size))
        rows, plans, sharded = _plan(spec, in_size, osz, linear, align, scales, f64)
        so = rg.out_spec(spec, [*in_size[:first], *osz], plans)
        gl = rg.grad_local(g, so)
        exs = rg.exchanges(spec, plans)
        lshape = rg.local_shape(spec)
        wshape = list(lshape)
        for ex in exs:
            wshape[ex.dim] = ex.n_window
        if any(v == 0 for v in gl.shape) or any(wshape[d] == 0 for d in sharded):
            gwin = tie(gl.new_zeros(wshape), gl)
        else:
            gwin = _resample_transpose(gl, rows, wshape)
        return ShardTensor(rg.gather_transpose(gwin, spec, exs), spec)

    return fwd, bwd


for _nsp, _lin in ((1, "upsample_linear1d"), (2, "upsample_bilinear2d"),
                   (3, "upsample_trilinear3d")):
    _upsample(f"upsample_nearest{_nsp}d", _nsp, False)
    _upsample(_lin, _nsp, True)
