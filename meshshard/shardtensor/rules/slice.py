"""Slices and ``select``: along an unsharded dim local; along the sharded dim as follows.

``slice`` of the sharded dim keeps each rank's rows (new per-rank counts, no data moves). Its
backward puts the gradient back in the input's layout when the forward was seen (eager), else
returns it Replicate (one all-gather of the gradient). ``select`` of the sharded dim: the
owner's row is all-gathered to every rank (Replicate). Counts are computed with
``sym_min``/``sym_max``, so symbolic sizes under ``torch.compile`` stay unguarded.
"""

from __future__ import annotations

import torch

from meshshard.shardtensor._aten.dispatch import (
    _REP,
    SHARDED,
    Plan,
    _all_gather_v,
    _coord,
    _local_shape,
    _moved,
    _replicated,
    _spec_with,
    to_replicate_local,
)
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import make_spec, shard_like

aten = torch.ops.aten


_SLICED: dict = {}  # forward slices seen: (layout of the result, slice) -> input sizes


def slice_counts(sizes, start, stop, step) -> list[tuple]:
    """Per-rank (local start, count) of the global rows ``start:stop:step`` (step > 0), with
    no branch on the sizes (``sym_min``/``sym_max``): symbolic sizes stay unguarded."""
    out, off = [], 0
    for s in sizes:
        lo, hi = off, off + s
        a = torch.sym_max(lo, start)
        a = a + (step - (a - start) % step) % step
        c = torch.sym_max((torch.sym_min(hi, stop) - a + step - 1) // step, 0)
        out.append((torch.sym_min(a - lo, s), c))
        off = hi
    return out


def norm_slice(start, end, step, n) -> tuple:
    """``slice(start, end, step).indices(n)`` for a symbolic ``n`` (start/end are ints)."""
    if step is None:
        step = 1
    if step <= 0:
        msg = f"slice step must be positive, got {step}"
        raise ValueError(msg)
    start = 0 if start is None else start
    end = n if end is None else end
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    clamp = torch.sym_min
    return clamp(torch.sym_max(start, 0), n), clamp(torch.sym_max(end, 0), n), step


def _local_end(a, c, step):
    return a + torch.sym_max((c - 1) * step + 1, 0)


def _local_slice_bwd(g, sizes, dim: int) -> Plan:
    """The backward of a slice along a dim that is not sharded: local."""
    local = list(_local_shape(g._spec))
    local[dim] = sizes[dim]
    return Plan((), ((1, local),), None,
                _spec_with(g._spec, g._spec.placements, g._spec.sizes, list(sizes)))


def _local_select(x, dim: int) -> Plan:
    """``select`` along a dim that is not sharded: local."""
    shape = [s for k, s in enumerate(x.shape) if k != dim]
    return _moved(x, lambda k: k - (k > dim), shape)


def _sharded_on(spec, dim):
    for i, p in enumerate(spec.placements):
        if isinstance(p, SHARDED) and p.dim == dim:
            if getattr(p, "blocks", 1) != 1:
                msg = f"a slice of the blocked dim {p} ({spec})"
                raise NotImplementedError(msg)
            return i
    return None


@register_rule(aten.slice.Tensor)
def _slice(func, args, kwargs) -> Plan:
    x = args[0]
    dim = (args[1] if len(args) > 1 else 0) % x.ndim
    i = _sharded_on(x._spec, dim)
    spec = x._spec
    start, end, step = norm_slice(args[2] if len(args) > 2 else None,
                                  args[3] if len(args) > 3 else None,
                                  args[4] if len(args) > 4 else 1, x.shape[dim])
    if i is None:  # not sharded along dim: the length computed without a guard
        shape = list(spec.shape)
        shape[dim] = torch.sym_max((end - start + step - 1) // step, 0)
        return Plan(outs=make_spec(spec.mesh, spec.placements, spec.sizes, tuple(shape)))
    cnts = slice_counts(spec.sizes[i], start, end, step)
    a, c = cnts[_coord(spec.mesh)[1][i]]
    sizes = list(spec.sizes)
    sizes[i] = tuple(n for _, n in cnts)
    shape = list(spec.shape)
    shape[dim] = sum(sizes[i])
    out = make_spec(spec.mesh, spec.placements, tuple(sizes), tuple(shape))
    try:
        _SLICED[(out.key(), dim, start, end, step)] = spec.sizes[i]
        if len(_SLICED) > 4096:
            _SLICED.clear()
    except TypeError:  # SymInt sizes while tracing: the backward gathers instead
        pass

    def call(loc, *_a, **_k):
        return aten.slice.Tensor(loc, dim, a, _local_end(a, c, step), step)

    return Plan((), (), call, out)


@register_rule(aten.slice_backward.default)
def _slice_bwd(func, args, kwargs) -> Plan:
    g, in_sizes, dim, start, end, step = args[:6]
    dim = dim % len(in_sizes)
    i = _sharded_on(g._spec, dim)
    if i is None:
        return _local_slice_bwd(g, in_sizes, dim)
    gs = g._spec
    start, end, step = norm_slice(start, end, step, in_sizes[dim])
    try:
        sizes_in = _SLICED.get((gs.key(), dim, start, end, step))
    except TypeError:
        sizes_in = None
    if sizes_in is None:  # not seen: the gradient, gathered, goes back Replicate
        out = _replicated(make_spec(gs.mesh, gs.placements, gs.sizes, tuple(in_sizes)))

        def gathered(gl, *_a, **_k):
            return func(to_replicate_local(gl, gs), list(in_sizes), dim, start, end, step)

        return Plan((), (), gathered, out)
    sizes = list(gs.sizes)
    sizes[i] = sizes_in
    out = make_spec(gs.mesh, gs.placements, tuple(sizes), tuple(in_sizes))
    a, c = slice_counts(sizes_in, start, end, step)[_coord(gs.mesh)[1][i]]
    local_in = _local_shape(out)

    def call(gl, *_a, **_k):
        return func(gl, local_in, dim, a, _local_end(a, c, step), step)

    return Plan((), (), call, out)


@register_rule(aten.select.int)
def _select(func, args, kwargs) -> Plan:
    x, dim = args[0], args[1] % args[0].ndim
    i = _sharded_on(x._spec, dim)
    if i is None:
        return _local_select(x, dim)
    spec = x._spec
    n = x.shape[dim]
    k = args[2] + n if args[2] < 0 else args[2]
    if not 0 <= k < n:
        msg = f"{func}: index {args[2]} out of range for the sharded dim {dim} of size {n}"
        raise IndexError(msg)
    cnts = slice_counts(spec.sizes[i], k, k + 1, 1)
    a, c = cnts[_coord(spec.mesh)[1][i]]
    counts = tuple(m for _, m in cnts)
    mesh = spec.mesh
    pl, sizes = [], []
    for j, p in enumerate(spec.placements):
        if j == i:
            pl.append(_REP)
            sizes.append(None)
        else:
            pl.append(shard_like(p, p.dim - (p.dim > dim)) if isinstance(p, SHARDED) else p)
            sizes.append(spec.sizes[j])
    shape = tuple(s for d, s in enumerate(spec.shape) if d != dim)

    def call(loc, *_a, **_k):  # the owner's row to everyone
        return _all_gather_v(loc.narrow(dim, a, c), dim, counts, mesh, i).squeeze(dim)

    return Plan((), (), call, make_spec(mesh, tuple(pl), tuple(sizes), shape))


@register_rule(aten.select_backward.default)
def _select_bwd(func, args, kwargs) -> Plan:
    g, in_sizes, dim = args[0], list(args[1]), args[2] % len(args[1])
    gs = g._spec
    pl = tuple(shard_like(p, p.dim + (p.dim >= dim)) if isinstance(p, SHARDED) else p
               for p in gs.placements)
    out = make_spec(gs.mesh, pl, gs.sizes, tuple(in_sizes))
    return Plan((), ((1, _local_shape(out)),), None, out)
