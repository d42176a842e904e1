"""Aten rules for pooling and padding on sharded grids.

Same scheme as the convolution (:mod:`.grid_conv`): today's plan functions say which rows each
rank's outputs read, :mod:`.grid_halo` fetches them (max pooling fills with -inf, the rest with
zeros or the pad value), the aten kernel runs on the window with no padding along the sharded
dims, and each backward rule runs the aten backward kernel on the window and sends the window's
gradient back to its owners.

- ``max_pool{2,3}d_with_indices`` (+ backward), ``adaptive_max_pool{2,3}d`` (+ backward):
  indices are global (flat over the global spatial dims, as one process returns them); the
  backward maps them back to the window.
- ``avg_pool{2,3}d`` (+ backward): torch's divisor is restored from global positions
  (``count_include_pad``, ceil-mode overhang; today's ``divisors``).
- ``_adaptive_avg_pool{2,3}d`` (+ backward) and adaptive max: output sizes that divide the
  sharded dims (then they are pools with kernel = stride = n / m), else a clear error.
- ``constant_pad_nd`` (its backward is itself with negated pads), ``reflection_pad{1,2,3}d``
  and ``replication_pad{1,2,3}d`` (+ backward). Circular padding decomposes above aten into
  ``as_strided``/``copy_`` on the sharded dim and is not covered.
"""

from __future__ import annotations

import torch

from meshshard.shardtensor._aten.grid_checks import check_pad, check_pool
from meshshard.shardtensor._aten.grid_halo import tie
from meshshard.shardtensor._aten.grid_plan import divisors, pad_plan, sliding_plan
from meshshard.shardtensor._aten.tensor import make_spec
from meshshard.shardtensor.rules.grid_conv import (
    ShardTensor,
    empty_window,
    exchanges,
    gather,
    gather_transpose,
    grad_local,
    grid_input,
    ints,
    local_shape,
    me_of,
    out_spec,
    register_rule,
    window_shape,
)

aten = torch.ops.aten


def _tup(v, n):
    v = [v] if isinstance(v, int) else list(v)
    return tuple(int(a) for a in (v * n if len(v) == 1 else v))


def _pool_out(n, k, s, p, dl, ceil):
    out = (n + 2 * p - dl * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    return out


def _pool_setup(x, nsp, k, s, p, dl, ceil, op, check=True):
    local, spec, sharded = grid_input(x, nsp, op)
    first = x.ndim - nsp
    n = ints(spec.shape[first:])
    gout = [_pool_out(n[a], k[a], s[a], p[a], dl[a], ceil) for a in range(nsp)]
    if check:
        check_pool(spec.shape, k, s, p, dl, gout)
    plans = [sliding_plan(d, sharded[d], ints(spec.sizes[sharded[d]]), gout[d - first],
                          k[d - first], s[d - first], dl[d - first], p[d - first])
             for d in sorted(sharded)]
    shape = [*ints(spec.shape[:first]), *gout]
    so = out_spec(spec, shape, plans)
    lp = [0 if first + a in sharded else p[a] for a in range(nsp)]
    starts = {}
    for pl in plans:  # global row of each window's first row
        off = sum(pl.out_sizes[: me_of(spec, pl.mesh_dim)])
        starts[pl.dim] = off * s[pl.dim - first] - p[pl.dim - first]
    return local, spec, sharded, first, so, exchanges(spec, plans), lp, starts


def _pool_args(args, nsp, with_dilation=True):
    k = _tup(args[1], nsp)
    s = _tup(args[2], nsp) if len(args) > 2 and args[2] not in (None, []) else k
    p = _tup(args[3], nsp) if len(args) > 3 else (0,) * nsp
    dl = _tup(args[4], nsp) if with_dilation and len(args) > 4 else (1,) * nsp
    ceil = bool(args[5] if with_dilation else args[4]) if len(args) > (5 if with_dilation
                                                                       else 4) else False
    return k, s, p, dl, ceil


# ------------------------------------------------------------------ index maps
def _strides(shape):
    out, acc = [], 1
    for v in reversed(shape):
        out.append(acc)
        acc *= v
    return out[::-1]


def _reindex(idx, src_shape, dst_shape, shift):
    """Flat indices over ``src_shape`` -> over ``dst_shape``, coordinate ``a`` moved by
    ``shift[a]``."""
    ss, ds = _strides(src_shape), _strides(dst_shape)
    out = None
    for a in range(len(src_shape)):
        c = torch.div(idx, ss[a], rounding_mode="floor") % src_shape[a]
        if shift[a]:
            c = c + shift[a]
        term = c * ds[a] if ds[a] != 1 else c
        out = term if out is None else out + term
    return out


def _shifts(first, nsp, starts, sign):
    return [sign * starts.get(first + a, 0) for a in range(nsp)]


# ------------------------------------------------------------------ max pooling
def _max_pool(nsp):
    @register_rule(getattr(aten, f"max_pool{nsp}d_with_indices").default, direct=True)
    def fwd(func, args, kwargs):
        x = args[0]
        k, s, p, dl, ceil = _pool_args(args, nsp)
        local, spec, sharded, first, so, exs, lp, starts = _pool_setup(
            x, nsp, k, s, p, dl, ceil, str(func))
        win = gather(local, spec, exs, float("-inf"))
        oshape = local_shape(so)
        if any(v == 0 for v in oshape) or empty_window(win.shape, sharded):
            out, idx = tie(win.new_zeros(oshape), win), torch.zeros(oshape, dtype=torch.long,
                                                                   device=win.device)
        else:
            out, idx = func(win, list(k), list(s), lp, list(dl), ceil)
            if starts:
                idx = _reindex(idx, list(win.shape[first:]), ints(spec.shape[first:]),
                               _shifts(first, nsp, starts, 1))
        return ShardTensor(out, so), ShardTensor(idx, so)

    @register_rule(getattr(aten, f"max_pool{nsp}d_with_indices_backward").default, direct=True)
    def bwd(func, args, kwargs):
        g, x, k, s, p, dl, ceil, idx = args
        k, s, p, dl = _tup(k, nsp), _tup(s, nsp) if s else _tup(k, nsp), _tup(p, nsp), \
            _tup(dl, nsp)
        local, spec, sharded, first, so, exs, lp, starts = _pool_setup(
            x, nsp, k, s, p, dl, ceil, str(func))
        gl, il = grad_local(g, so), grad_local(idx, so)
        wshape = window_shape(local.shape, exs)
        if any(v == 0 for v in gl.shape) or empty_window(wshape, sharded):
            gwin = tie(local.new_zeros(wshape), gl)
        else:
            if starts:
                il = _reindex(il, ints(spec.shape[first:]), wshape[first:],
                              _shifts(first, nsp, starts, -1))
            gwin = func(gl, local.new_zeros(wshape), list(k), list(s), lp, list(dl), ceil, il)
        return ShardTensor(gather_transpose(gwin, spec, exs), spec)

    return fwd, bwd


# ------------------------------------------------------------------ average pooling
def _avg_factor(spec, so, sharded, first, k, s, p, ceil, cip, gshape, like):
    fac = None
    for d in sorted(sharded):
        a = d - first
        div = divisors(int(spec.shape[d]), int(gshape[d]), k[a], s[a], p[a], cip)
        off = sum(so.sizes[sharded[d]][: me_of(spec, sharded[d])])
        m = int(so.sizes[sharded[d]][me_of(spec, sharded[d])])
        shape = [1] * len(gshape)
        shape[d] = m
        f = torch.tensor(k[a] / div[off : off + m], dtype=like.dtype,
                         device=like.device).reshape(shape)
        fac = f if fac is None else fac * f
    return fac


def _avg_pool(nsp):
    @register_rule(getattr(aten, f"avg_pool{nsp}d").default, direct=True)
    def fwd(func, args, kwargs):
        x, kk = args[0], args[1]
        k = _tup(kk, nsp)
        s = _tup(args[2], nsp) if len(args) > 2 and args[2] not in (None, []) else k
        p = _tup(args[3], nsp) if len(args) > 3 else (0,) * nsp
        ceil = bool(args[4]) if len(args) > 4 else False
        cip = bool(args[5]) if len(args) > 5 else True
        override = args[6] if len(args) > 6 else None
        local, spec, sharded, first, so, exs, lp, _ = _pool_setup(
            x, nsp, k, s, p, (1,) * nsp, ceil, str(func))
        win = gather(local, spec, exs)
        oshape = local_shape(so)
        if any(v == 0 for v in oshape) or empty_window(win.shape, sharded):
            return ShardTensor(tie(win.new_zeros(oshape), win), so)
        out = func(win, list(k), list(s), lp, ceil, cip, override)
        if override is None and sharded:
            out = out * _avg_factor(spec, so, sharded, first, k, s, p, ceil, cip, so.shape, out)
        return ShardTensor(out, so)

    @register_rule(getattr(aten, f"avg_pool{nsp}d_backward").default, direct=True)
    def bwd(func, args, kwargs):
        g, x, k, s, p, ceil, cip, override = args
        k = _tup(k, nsp)
        s, p = (_tup(s, nsp) if s else k), _tup(p, nsp)
        local, spec, sharded, first, so, exs, lp, _ = _pool_setup(
            x, nsp, k, s, p, (1,) * nsp, ceil, str(func))
        gl = grad_local(g, so)
        wshape = window_shape(local.shape, exs)
        if any(v == 0 for v in gl.shape) or empty_window(wshape, sharded):
            gwin = tie(local.new_zeros(wshape), gl)
        else:
            if override is None and sharded:
                gl = gl * _avg_factor(spec, so, sharded, first, k, s, p, ceil, cip, so.shape,
                                      gl)
            gwin = func(gl, local.new_zeros(wshape), list(k), list(s), lp, ceil, cip,
                        override)
        return ShardTensor(gather_transpose(gwin, spec, exs), spec)

    return fwd, bwd


# ------------------------------------------------------------------ adaptive pooling
def _adaptive_kernel(x, nsp, output_size, op):
    _, spec, sharded = grid_input(x, nsp, op)
    first = x.ndim - nsp
    osz = [int(v) for v in output_size]
    k = [1] * nsp
    for d in sharded:
        n, m = int(spec.shape[d]), osz[d - first]
        if m == 0 or n % m:
            msg = (f"{op}: output size {m} does not divide the sharded dim {d} of size {n}; "
                   "choose an output size that divides it (or replicate the dim)")
            raise NotImplementedError(msg)
        k[d - first] = n // m
    return tuple(k), osz


def _with_shape(spec, shape):
    return make_spec(spec.mesh, spec.placements, spec.sizes, tuple(shape))


def _adaptive(nsp, kind):
    name = f"_adaptive_avg_pool{nsp}d" if kind == "avg" else f"adaptive_max_pool{nsp}d"

    @register_rule(getattr(aten, name).default, direct=True)
    def fwd(func, args, kwargs):
        x, output_size = args[0], args[1]
        k, osz = _adaptive_kernel(x, nsp, output_size, str(func))
        local, spec, sharded, first, so, exs, _, starts = _pool_setup(
            x, nsp, k, k, (0,) * nsp, (1,) * nsp, False, str(func), check=False)
        so = _with_shape(so, [*ints(so.shape[:first]), *osz])
        win = gather(local, spec, exs, float("-inf") if kind == "max" else 0.0)
        oshape = local_shape(so)
        lsz = [oshape[first + a] for a in range(nsp)]
        if any(v == 0 for v in oshape) or empty_window(win.shape, sharded):
            out = tie(win.new_zeros(oshape), win)
            if kind == "avg":
                return ShardTensor(out, so)
            return ShardTensor(out, so), ShardTensor(
                torch.zeros(oshape, dtype=torch.long, device=win.device), so)
        if kind == "avg":
            return ShardTensor(func(win, lsz), so)
        out, idx = func(win, lsz)
        if starts:
            idx = _reindex(idx, list(win.shape[first:]), ints(spec.shape[first:]),
                           _shifts(first, nsp, starts, 1))
        return ShardTensor(out, so), ShardTensor(idx, so)

    bname = f"_adaptive_avg_pool{nsp}d_backward" if kind == "avg" else \
        f"adaptive_max_pool{nsp}d_backward"

    @register_rule(getattr(aten, bname).default, direct=True)
    def bwd(func, args, kwargs):
        g, x = args[0], args[1]
        k, _ = _adaptive_kernel(x, nsp, g.shape[x.ndim - nsp:], str(func))
        local, spec, sharded, first, so, exs, _, starts = _pool_setup(
            x, nsp, k, k, (0,) * nsp, (1,) * nsp, False, str(func), check=False)
        so = _with_shape(so, ints(g.shape))
        gl = grad_local(g, so)
        wshape = window_shape(local.shape, exs)
        if any(v == 0 for v in gl.shape) or empty_window(wshape, sharded):
            gwin = tie(local.new_zeros(wshape), gl)
        elif kind == "avg":
            gwin = func(gl, local.new_zeros(wshape))
        else:
            il = grad_local(args[2], so)
            if starts:
                il = _reindex(il, ints(spec.shape[first:]), wshape[first:],
                              _shifts(first, nsp, starts, -1))
            gwin = func(gl, local.new_zeros(wshape), il)
        return ShardTensor(gather_transpose(gwin, spec, exs), spec)

    return fwd, bwd


for _nd in (2, 3):
    _max_pool(_nd)
    _avg_pool(_nd)
    _adaptive(_nd, "avg")
    _adaptive(_nd, "max")


# ------------------------------------------------------------------ padding
def _pad_setup(x, pad, mode, op):
    check_pad(x.shape, pad, mode)
    nsp = len(pad) // 2
    local, spec, sharded = grid_input(x, nsp, op) if mode != "constant" else \
        _any_input(x, op)
    nd = x.ndim
    pad = [int(v) for v in pad]
    local_pad = list(pad)
    plans = []
    for d in sorted(sharded):
        kk = nd - 1 - d
        if 2 * kk + 1 >= len(pad) or (pad[2 * kk] == 0 and pad[2 * kk + 1] == 0):
            continue
        i = sharded[d]
        if sum(ints(spec.sizes[i])) == 0:
            msg = f"{op}: dim {d} is sharded with global size 0"
            raise ValueError(msg)
        plans.append(pad_plan(d, i, ints(spec.sizes[i]), pad[2 * kk], pad[2 * kk + 1], mode))
        local_pad[2 * kk] = local_pad[2 * kk + 1] = 0
    shape = list(ints(spec.shape))
    for kk in range(len(pad) // 2):
        shape[nd - 1 - kk] += pad[2 * kk] + pad[2 * kk + 1]
    so = out_spec(spec, shape, plans)
    return local, spec, sharded, so, exchanges(spec, plans), local_pad


def _any_input(x, op):
    """constant_pad_nd may pad any dim: every Shard placement is a candidate."""
    return grid_input(x, x.ndim, op)


@register_rule(aten.constant_pad_nd.default, direct=True)
def _constant_pad(func, args, kwargs):
    x, pad = args[0], args[1]
    value = float(args[2]) if len(args) > 2 else float(kwargs.get("value", 0.0))
    local, spec, sharded, so, exs, lpad = _pad_setup(x, pad, "constant", str(func))
    win = gather(local, spec, exs, value)
    oshape = local_shape(so)
    if any(v == 0 for v in oshape) or empty_window(win.shape, [e.dim for e in exs]):
        return ShardTensor(tie(win.new_full(oshape, value), win), so)
    return ShardTensor(func(win, lpad, value) if any(lpad) else win, so)


def _mode_pad(nsp, mode, prefix):
    @register_rule(getattr(aten, f"{prefix}_pad{nsp}d").default, direct=True)
    def fwd(func, args, kwargs):
        x, pad = args[0], args[1]
        local, spec, sharded, so, exs, lpad = _pad_setup(x, pad, mode, str(func))
        win = gather(local, spec, exs)
        oshape = local_shape(so)
        if any(v == 0 for v in oshape) or empty_window(win.shape, [e.dim for e in exs]):
            return ShardTensor(tie(win.new_zeros(oshape), win), so)
        return ShardTensor(func(win, lpad) if any(lpad) else win, so)

    @register_rule(getattr(aten, f"{prefix}_pad{nsp}d_backward").default, direct=True)
    def bwd(func, args, kwargs):
        g, x, pad = args
        local, spec, sharded, so, exs, lpad = _pad_setup(x, pad, mode, str(func))
        gl = grad_local(g, so)
        wshape = window_shape(local.shape, exs)
        if any(v == 0 for v in gl.shape) or empty_window(wshape, [e.dim for e in exs]):
            gwin = tie(local.new_zeros(wshape), gl)
        else:
            gwin = func(gl, local.new_zeros(wshape), lpad) if any(lpad) else gl
        return ShardTensor(gather_transpose(gwin, spec, exs), spec)

    return fwd, bwd


for _nd in (1, 2, 3):
    _mode_pad(_nd, "reflect", "reflection")
    _mode_pad(_nd, "replicate", "replication")
