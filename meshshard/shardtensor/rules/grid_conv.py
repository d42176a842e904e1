"""Aten rules for grids: convolution and its backward.

Inputs are ``(N, C, *spatial)`` tensors sharded along spatial dims (any of them, on a 1-D or
N-D mesh, uneven and empty slabs) and optionally the batch dim; weights are Replicate (plain
model weights arrive lifted). Each rule takes the pure plan functions of :mod:`.grid_plan`
(``sliding_plan`` and friends: who owns which output, which input rows each rank's outputs
read), fetches the window with :mod:`.grid_halo` (only rows that cross a
cut move) and runs the ordinary aten kernel on it with no padding along the sharded dims. The
backward rules recompute the window when the weight gradient needs the input (one more
exchange), run the aten backward kernel on it and send the window's gradient back to its
owners (the reverse exchange); weight and bias gradients are Partial over the sharded mesh dims.

Shared helpers for the other grid rule modules (:mod:`.grid_window`, :mod:`.grid_norm`, ...)
live here too.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.errors import LayoutError
from meshshard.shardtensor._aten.dispatch import (
    _all_reduce,
    _coord,
    from_replicate_local,
    respec_local,
    same_layout,
)
from meshshard.shardtensor._aten.grid_checks import check_conv, check_mesh
from meshshard.shardtensor._aten.grid_halo import (
    check_hops,
    exchange_plan,
    fetch,
    fetch_transpose,
    tie,
)
from meshshard.shardtensor._aten.grid_plan import sliding_plan, transpose_plan
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import ShardTensor, make_spec
from meshshard.shardtensor.grid import max_hops

aten = torch.ops.aten
_REP = Replicate()


# ------------------------------------------------------------------ shared helpers
def ints(v) -> tuple:
    return tuple(int(a) for a in v)


def grid_input(x, nsp: int, op) -> tuple:
    """(local, spec, sharded) of a grid input: Partials summed, ``sharded`` maps each sharded
    spatial tensor dim to its mesh dim. Channel or Blocked sharding: a clear error."""
    if type(x) is not ShardTensor:
        msg = f"{op}: the grid input must be the ShardTensor (only it may be sharded)"
        raise NotImplementedError(msg)
    spec = x._spec
    local = x._local
    first = x.ndim - nsp
    pl = list(spec.placements)
    sharded = {}
    for i, p in enumerate(pl):
        if isinstance(p, Partial):
            local = _all_reduce(local, spec.mesh, i)
            pl[i] = _REP
        elif isinstance(p, Shard):
            if first - 1 <= p.dim < first:
                msg = (f"{op}: the input is sharded along its channel dim {p.dim}; grid rules "
                       "shard spatial dims (and the batch dim). Redistribute the channels to "
                       "Replicate and shard a spatial dim instead")
                raise LayoutError(msg)
            if p.dim >= first:
                sharded[p.dim] = i
        elif not isinstance(p, Replicate):
            msg = f"{op}: input layout {spec} (a flattened/Blocked grid) is not supported"
            raise NotImplementedError(msg)
    if tuple(pl) != spec.placements:
        spec = make_spec(spec.mesh, tuple(pl), spec.sizes, spec.shape)
    return local, spec, sharded


def rep_local(t, op):
    """The full local value of a weight-like argument (Replicate; Partial is summed)."""
    if type(t) is not ShardTensor:
        return t
    loc = t._local
    for i, p in enumerate(t._spec.placements):
        if isinstance(p, Partial):
            loc = _all_reduce(loc, t._spec.mesh, i)
        elif not isinstance(p, Replicate):
            msg = f"{op}: only the grid input may be sharded; got a weight laid out {t._spec}"
            raise NotImplementedError(msg)
    return loc


def me_of(spec, mesh_dim: int) -> int:
    return _coord(spec.mesh)[1][mesh_dim]


def exchanges(spec, plans) -> list:
    """This rank's exchange for each plan (a ``DimPlan``: dim, mesh_dim, out_sizes, needs),
    after :func:`meshshard.shardtensor.grid.halo_limit`'s check when a limit is set."""
    hops = max_hops()
    out = []
    for p in plans:
        sizes = ints(spec.sizes[p.mesh_dim])
        if hops is not None:
            check_hops(sizes, p.needs, p.periodic, hops)
        out.append(exchange_plan(p.dim, p.mesh_dim, sizes, p.needs, me_of(spec, p.mesh_dim)))
    return out


def gather(local, spec, exs, fill: float = 0.0, phase: str = "forward"):
    """Apply every exchange in turn (corners of 2-D splits arrive with the second one).
    ``phase``: "backward" when a backward rule re-fetches its input (for the halo count)."""
    for ex in exs:
        local = fetch(local, ex, spec.mesh, fill, phase=phase)
    return local


def gather_transpose(g, spec, exs):
    for ex in reversed(exs):
        shape = list(g.shape)
        shape[ex.dim] = ex.n_local
        g = fetch_transpose(g, ex, shape, spec.mesh)
    return g


def window_shape(local_shape, exs) -> list:
    shape = list(local_shape)
    for ex in exs:
        shape[ex.dim] = ex.n_window
    return shape


def out_spec(spec, shape, plans):
    sizes = list(spec.sizes)
    for p in plans:
        sizes[p.mesh_dim] = p.out_sizes
    return make_spec(spec.mesh, spec.placements, tuple(sizes), tuple(int(v) for v in shape))


def local_shape(spec) -> list:
    shape = [int(v) for v in spec.shape]
    for i, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            shape[p.dim] = int(spec.sizes[i][me_of(spec, i)])
    return shape


def partial_spec(spec, shape):
    """Sum of per-rank contributions (weight gradients): Partial on every sharded mesh dim."""
    pl = tuple(Partial() if isinstance(p, Shard) else _REP for p in spec.placements)
    return make_spec(spec.mesh, pl, (None,) * len(pl), tuple(int(v) for v in shape))


def replicate_spec_of(spec, shape):
    return make_spec(spec.mesh, (_REP,) * len(spec.placements), (None,) * len(spec.placements),
                     tuple(int(v) for v in shape))


def grad_local(g, spec):
    """``g`` (a gradient wrapper, or a plain replicated tensor) as a local piece of ``spec``.
    A split that differs only in slab sizes moves the rows that change owner (all-to-all)."""
    if type(g) is not ShardTensor:
        return from_replicate_local(g, spec)
    gs = g._spec
    if same_layout(gs, spec):
        return g._local
    loc = g._local
    pl = list(gs.placements)
    for i, p in enumerate(pl):
        if isinstance(p, Partial):
            loc = _all_reduce(loc, gs.mesh, i)
            pl[i] = _REP
    mid = make_spec(gs.mesh, tuple(pl), gs.sizes, gs.shape)
    return respec_local(loc, mid, spec)


def wrap(t, spec):
    return None if t is None else ShardTensor(t, spec)


def empty_window(shape, sharded) -> bool:
    return any(shape[d] == 0 for d in sharded)


# ------------------------------------------------------------------ convolution
def _conv_setup(x, w, stride, padding, dilation, transposed, opad, groups, op):
    local, spec, sharded = grid_input(x, w.ndim - 2, op)
    nsp = w.ndim - 2
    first = x.ndim - nsp
    k = ints(w.shape[2:])
    n = ints(spec.shape[first:])
    s, p, dl = ints(stride), ints(padding), ints(dilation)
    op_ = ints(opad) if transposed else (0,) * nsp
    c_out = int(w.shape[0])  # transposed: from the groups, in _conv_out_spec
    plans, starts = [], {}
    gout = []
    for a in range(nsp):
        if transposed:
            gout.append((n[a] - 1) * s[a] - 2 * p[a] + dl[a] * (k[a] - 1) + op_[a] + 1)
        else:
            gout.append((n[a] + 2 * p[a] - dl[a] * (k[a] - 1) - 1) // s[a] + 1)
    check_conv(x.shape, w.shape, p, dl, transposed, int(groups), gout)
    for d in sorted(sharded):
        a, i = d - first, sharded[d]
        if transposed:
            plan, st0 = transpose_plan(d, i, ints(spec.sizes[i]), gout[a], k[a], s[a], dl[a],
                                       p[a])
            starts[d] = st0[me_of(spec, i)]
        else:
            plan = sliding_plan(d, i, ints(spec.sizes[i]), gout[a], k[a], s[a], dl[a], p[a])
        plans.append(plan)
    return local, spec, sharded, first, k, s, p, dl, op_, c_out, plans, starts, gout


def _conv_out_spec(spec, x, c_out, gout, plans, groups, transposed, w):
    if transposed:
        c_out = int(w.shape[1]) * groups
    shape = [int(x.shape[0]), c_out, *gout]
    return out_spec(spec, shape, plans)


@register_rule(aten.convolution.default, direct=True)
def _convolution(func, args, kwargs):
    x, w, b, stride, padding, dilation, transposed, opad, groups = args
    name = "convolution_transpose" if transposed else "convolution"
    (local, spec, sharded, first, k, s, p, dl, op_, c_out, plans, starts,
     gout) = _conv_setup(x, w, stride, padding, dilation, transposed, opad, groups, name)
    check_mesh(name, spec.mesh, w, b)
    wl, bl = rep_local(w, name), rep_local(b, name)
    so = _conv_out_spec(spec, x, c_out, gout, plans, groups, transposed, w)
    exs = exchanges(spec, plans)
    win = gather(local, spec, exs)
    oshape = local_shape(so)
    lp = [0 if first + a in sharded else p[a] for a in range(len(k))]
    if any(v == 0 for v in oshape) or empty_window(win.shape, sharded):
        out = tie(win.new_zeros(oshape), win)
        if transposed and bl is not None:
            out = out + bl.reshape([1, -1] + [1] * len(k))
        return ShardTensor(out, so)
    if not transposed:
        return ShardTensor(func(win, wl, bl, list(s), lp, list(dl), False, list(op_),
                                    groups), so)
    lop = [0 if first + a in sharded else op_[a] for a in range(len(k))]
    raw = func(win, wl, None, list(s), lp, list(dl), True, lop, groups)
    out = raw
    crop = _crop(raw.shape, oshape, starts, first, len(k))
    if any(crop):
        out = aten.constant_pad_nd(raw, crop, 0.0)
    if bl is not None:
        out = out + bl.reshape([1, -1] + [1] * len(k))
    return ShardTensor(out, so)


def _crop(raw_shape, oshape, starts, first, nsp) -> list:
    """Pad pairs (last dim first) cutting this rank's outputs out of the raw transposed conv."""
    crop = [0] * (2 * nsp)
    for d, lo in starts.items():
        a = d - first
        crop[2 * (nsp - 1 - a)] = -lo
        crop[2 * (nsp - 1 - a) + 1] = lo + oshape[d] - raw_shape[d]
    return crop


@register_rule(aten.convolution_backward.default, direct=True)
def _convolution_backward(func, args, kwargs):
    (g, x, w, bias_sizes, stride, padding, dilation, transposed, opad, groups,
     mask) = args
    name = "convolution_backward"
    (local, spec, sharded, first, k, s, p, dl, op_, c_out, plans, starts,
     gout) = _conv_setup(x, w, stride, padding, dilation, transposed, opad, groups, name)
    check_mesh(name, spec.mesh, g, w)
    wl = rep_local(w, name)
    so = _conv_out_spec(spec, x, c_out, gout, plans, groups, transposed, w)
    gl = grad_local(g, so)
    exs = exchanges(spec, plans)
    if mask[1]:
        win = gather(local, spec, exs, phase="backward")
    else:  # the input gradient reads only the input's shape
        win = local.new_zeros(window_shape(local.shape, exs))
    oshape = local_shape(so)
    nsp = len(k)
    lp = [0 if first + a in sharded else p[a] for a in range(nsp)]
    bdims = [0, *range(2, 2 + nsp)]
    if any(v == 0 for v in oshape) or empty_window(win.shape, sharded):
        gwin = tie(win.new_zeros(win.shape), win, gl)
        gw, gb = tie(wl.new_zeros(wl.shape), gl), gl.sum(bdims)
    elif not transposed:
        gwin, gw, gb = func(gl, win, wl, bias_sizes, list(s), lp, list(dl), False, list(op_),
                            groups, list(mask))
    else:
        lop = [0 if first + a in sharded else op_[a] for a in range(nsp)]
        raw_shape = list(oshape)
        for d in starts:
            a = d - first
            raw_shape[d] = (win.shape[d] - 1) * s[a] + dl[a] * (k[a] - 1) + 1
        crop = _crop(raw_shape, oshape, starts, first, nsp)
        graw = aten.constant_pad_nd(gl, [-c for c in crop], 0.0) if any(crop) else gl
        gwin, gw, _ = func(graw, win, wl, None, list(s), lp, list(dl), True, lop, groups,
                           [mask[0], mask[1], False])
        gb = gl.sum(bdims) if mask[2] else None
    gx = gather_transpose(gwin, spec, exs) if mask[0] else None
    ps = partial_spec(spec, wl.shape)
    return (wrap(gx, spec), wrap(gw if mask[1] else None, ps),
            wrap(gb if mask[2] else None, partial_spec(spec, (so.shape[1],))))
