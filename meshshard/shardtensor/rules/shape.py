"""Shape ops: dims moved, added or dropped, and the ops that move rows between ranks.

* ``permute``/``transpose``/``t``/``unsqueeze``/``squeeze``/``expand``/``split``: the shards
  follow their dims (local); ``squeeze`` drops only globally size-1 dims.
* ``cat`` along the sharded dim: rank r ends up with the sum of every operand's rows on r
  (replicated operands count as split evenly); only rows whose owner changes move (one uneven
  all-to-all, :func:`move_rows`). Along another dim: every operand in the first's layout, local.
* ``flip`` along the sharded dim (the backward of a sharded cumsum): each rank keeps its size;
  the rows go to the mirrored rank. ``roll`` along the sharded dim: rows move by the shift.
* ``stack``, ``unbind``, ``repeat`` (a repeat of the sharded dim is ``Blocked``: every block
  holds each rank's rows), ``flip``/``roll`` of unsharded dims: local.

``view``/``reshape`` are in :mod:`.view`, products in :mod:`.linalg`.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial

from meshshard.shardtensor._aten.collective_ops import fc as _fc
from meshshard.shardtensor._aten.dispatch import (
    SHARDED,
    Plan,
    ShardTensor,
    _check_free,
    _coord,
    _local_shape,
    _moved,
    _replicated,
    _spec_with,
    check,
    same_layout,
)
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import make_spec, shard_like

aten = torch.ops.aten


def even_sizes(n, k: int) -> tuple:
    return tuple(n // k + (1 if r < n % k else 0) for r in range(k))


def move_rows(pieces: list, dim: int, target: tuple, mesh, i: int, order=None) -> torch.Tensor:
    """Redistribute rows along ``dim`` over mesh dim ``i``. ``pieces``: ``(local, starts,
    sizes)`` per piece: on rank q the piece's local rows are the global rows
    ``[starts[q], starts[q] + sizes[q])`` of the result (pieces tile it). ``order``: the
    ``(piece, rank)`` runs in increasing global position (default: piece-major, ranks
    ascending). Returns this rank's rows ``[T_me, T_me + target[me])``, ``T`` the prefix sums
    of ``target``. Only rows whose owner changes cross the wire: one all-to-all whose split
    sizes are computed from the sizes alone, with no branch on them (``sym_min``/``sym_max``),
    so symbolic sizes stay unguarded under ``torch.compile``."""
    n = mesh.size(i)
    me = _coord(mesh)[1][i]
    smin, smax = torch.sym_min, torch.sym_max
    toff = [0]
    for t in target:
        toff.append(toff[-1] + t)

    def chunk(k, q, dst):  # (local start, count) of piece k's rows on q that go to dst
        _loc, starts, sizes = pieces[k]
        lo = starts[q]
        a = smax(lo, toff[dst])
        c = smax(smin(lo + sizes[q], toff[dst + 1]) - a, 0)
        return smin(a - lo, sizes[q]), c

    kk = range(len(pieces))
    parts, send_counts = [], []
    for dst in range(n):
        cnt = 0
        for k in kk:
            st, c = chunk(k, me, dst)
            parts.append(pieces[k][0].narrow(dim, st, c).movedim(dim, 0))
            cnt = cnt + c
        send_counts.append(cnt)
    buf = torch.cat(parts)
    recv = {(k, q): chunk(k, q, me)[1] for k in kk for q in range(n)}
    recv_counts = [sum(recv[(k, q)] for k in kk) for q in range(n)]
    if n == 1:
        got = buf
    else:
        check("all_to_all", mesh, i, buf, "rows changing owner", varying_dim=0)
        got = _fc.wait_tensor(_fc.all_to_all_single(buf.contiguous(), recv_counts,
                                                    send_counts, _coord(mesh)[2][i]))
    pos, where = 0, {}
    for q in range(n):  # received grouped by source, pieces in order
        for k in kk:
            where[(k, q)] = pos
            pos = pos + recv[(k, q)]
    order = order or [(k, q) for k in kk for q in range(n)]
    return torch.cat([got.narrow(0, where[kq], recv[kq]) for kq in order]).movedim(0, dim)


def _shard_mesh_dims(spec, dim) -> list[int]:
    return [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED) and p.dim == dim]


def _plain_blocks(spec, i, func):
    if getattr(spec.placements[i], "blocks", 1) != 1:
        msg = f"{func} along the blocked dim {spec.placements[i]} (view it back first)"
        raise NotImplementedError(msg)


# ------------------------------------------------------------------ cat
def _local_cat(tensors, dim: int, ref) -> Plan:
    """``cat`` along a dim no operand is sharded on: every operand in ``ref``'s layout, local."""
    steps = []
    rs = ref._spec
    for j, t in enumerate(tensors):
        if type(t) is ShardTensor and t._spec.placements == rs.placements \
                and t._spec.sizes == rs.sizes:
            continue
        shape = list(rs.shape)
        shape[dim] = t.shape[dim]
        tspec = make_spec(rs.mesh, rs.placements, rs.sizes, tuple(shape))
        src = t._spec if type(t) is ShardTensor else _replicated(tspec)
        steps.append(((0, j), ("respec", src, tspec)))
    shape = list(ref.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return Plan(tuple(steps), (), None, _spec_with(rs, rs.placements, rs.sizes, shape))


@register_rule(aten.cat.default)
def _cat(func, args, kwargs) -> Plan:
    tensors = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    ref = next(t for t in tensors if type(t) is ShardTensor)
    dim = dim % ref.ndim
    over = [i for t in tensors if type(t) is ShardTensor
            for i in _shard_mesh_dims(t._spec, dim)]
    if not over:
        return _local_cat(tensors, dim, ref)
    i = over[0]
    rs = next(t._spec for t in tensors if type(t) is ShardTensor
              and i in _shard_mesh_dims(t._spec, dim))
    _plain_blocks(rs, i, func)
    mesh, n = rs.mesh, rs.mesh.size(i)
    steps, specs = [], []
    for j, t in enumerate(tensors):  # every operand: the reference's other placements,
        shape = list(rs.shape)        # Shard(dim) on mesh dim i with its own (or even) sizes
        shape[dim] = t.shape[dim]
        own = t._spec.sizes[i] if type(t) is ShardTensor and \
            i in _shard_mesh_dims(t._spec, dim) else even_sizes(t.shape[dim], n)
        sizes = list(rs.sizes)
        sizes[i] = tuple(own)
        tspec = make_spec(mesh, rs.placements, tuple(sizes), tuple(shape))
        specs.append(tspec)
        if type(t) is ShardTensor and same_layout(t._spec, tspec):
            continue
        src = t._spec if type(t) is ShardTensor else _replicated(tspec)
        steps.append(((0, j), ("respec", src, tspec)))
    target = tuple(sum(s.sizes[i][r] for s in specs) for r in range(n))
    base, starts = 0, []
    for s in specs:
        st, acc = [], base
        for r in range(n):
            st.append(acc)
            acc = acc + s.sizes[i][r]
        starts.append(tuple(st))
        base = acc
    shape = list(rs.shape)
    shape[dim] = base
    sizes = list(rs.sizes)
    sizes[i] = target
    out = make_spec(mesh, rs.placements, tuple(sizes), tuple(shape))

    def call(locs, *_a, **_k):
        return move_rows([(loc, st, s.sizes[i]) for loc, st, s in zip(locs, starts, specs)],
                         dim, target, mesh, i)

    return Plan(tuple(steps), (), call, out)


# ------------------------------------------------------------------ dims moved, added, dropped
@register_rule(aten.permute.default)
def _permute(func, args, kwargs) -> Plan:
    x, dims = args[0], [d % args[0].ndim for d in args[1]]
    return _moved(x, dims.index, [x.shape[d] for d in dims])


@register_rule(aten.transpose.int)
def _transpose(func, args, kwargs) -> Plan:
    x = args[0]
    a, b = args[1] % x.ndim, args[2] % x.ndim
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return _moved(x, perm.index, [x.shape[d] for d in perm])


@register_rule(aten.t.default)
def _t(func, args, kwargs) -> Plan:
    x = args[0]
    perm = list(range(x.ndim))[::-1]
    return _moved(x, perm.index, [x.shape[d] for d in perm])


@register_rule(aten.unsqueeze.default)
def _unsqueeze(func, args, kwargs) -> Plan:
    x = args[0]
    d = args[1] % (x.ndim + 1)
    shape = list(x.shape)
    shape.insert(d, 1)
    return _moved(x, lambda k: k + (k >= d), shape)


@register_rule(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(func, args, kwargs) -> Plan:
    x = args[0]
    if func is aten.squeeze.default:
        dims = [d for d in range(x.ndim) if x.shape[d] == 1]
    elif func is aten.squeeze.dim:
        dims = [args[1] % x.ndim] if x.shape[args[1] % x.ndim] == 1 else []
    else:
        dims = [d % x.ndim for d in args[1] if x.shape[d % x.ndim] == 1]
    _check_free(x, dims, func)
    shape = [s for k, s in enumerate(x.shape) if k not in dims]
    plan = _moved(x, lambda k: k - sum(1 for d in dims if d < k), shape)

    def call(loc, *_a, **_k):  # the globally size-1 dims only: a 1-row shard keeps its dim
        return aten.squeeze.dims(loc, dims)

    return plan._replace(call=call)


@register_rule(aten.expand.default)
def _expand(func, args, kwargs) -> Plan:
    x, target = args[0], list(args[1])
    spec = x._spec
    lead = len(target) - x.ndim
    shape = [x.shape[k - lead] if (t == -1) else t for k, t in enumerate(target)]
    local_target = list(shape)
    loc_shape = _local_shape(spec)
    pl = []
    for p in spec.placements:
        if isinstance(p, SHARDED):
            od = p.dim + lead
            local_target[od] = loc_shape[p.dim]
            pl.append(shard_like(p, od))
        else:
            pl.append(p)
    return Plan((), ((1, local_target),), None, _spec_with(spec, pl, spec.sizes, shape))


@register_rule(aten.split_with_sizes.default, aten.split.Tensor)
def _split(func, args, kwargs) -> Plan:
    x, dim = args[0], (args[2] if len(args) > 2 else 0) % args[0].ndim
    _check_free(x, [dim], func)
    full = x.shape[dim]
    if func is aten.split.Tensor:
        step = args[1]
        parts = [min(step, full - o) for o in range(0, full, step)]
    else:
        parts = list(args[1])
    outs = []
    for n in parts:
        shape = list(x.shape)
        shape[dim] = n
        outs.append(_spec_with(x._spec, x._spec.placements, x._spec.sizes, shape))
    return Plan(outs=outs)


# ------------------------------------------------------------------ flip / roll
@register_rule(aten.flip.default)
def _flip(func, args, kwargs) -> Plan:
    x, spec = args[0], args[0]._spec
    dims = [d % x.ndim for d in args[1]]
    over = [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED)
            and p.dim in dims]
    if not over:
        return Plan(outs=spec)
    mesh = spec.mesh
    for i in over:
        _plain_blocks(spec, i, func)

    def call(loc, *_a, **_k):
        loc = aten.flip.default(loc, dims)
        for i in over:  # rank q's flipped rows are the result's rows [N - off_q - s_q, ...)
            p, s = spec.placements[i].dim, spec.sizes[i]
            total = sum(s)
            starts = tuple(total - sum(s[: q + 1]) for q in range(len(s)))
            loc = move_rows([(loc, starts, s)], p, s, mesh, i,
                            order=[(0, q) for q in reversed(range(len(s)))])
        return loc

    return Plan((), (), call, spec)


@register_rule(aten.roll.default)
def _roll(func, args, kwargs) -> Plan:
    x, spec = args[0], args[0]._spec
    shifts = list(args[1])
    dims = list(args[2]) if len(args) > 2 else kwargs.get("dims", [])
    if not dims:
        if any(isinstance(p, SHARDED) for p in spec.placements):
            msg = f"{func} without dims (over the flattened tensor) of a sharded {spec}"
            raise NotImplementedError(msg)
        return Plan(outs=spec)
    dims = [d % x.ndim for d in dims]
    local, moves = [], []
    for sh, d in zip(shifts, dims):
        over = _shard_mesh_dims(spec, d)
        if over:
            _plain_blocks(spec, over[0], func)
            moves.append((over[0], d, sh))
        else:
            local.append((sh, d))
    mesh = spec.mesh

    def call(loc, *_a, **_k):
        if local:
            loc = aten.roll.default(loc, [s for s, _ in local], [d for _, d in local])
        for i, d, sh in moves:  # source row g goes to (g + k) mod N
            s = spec.sizes[i]
            total = sum(s)
            k = sh % total if total else 0
            los = [sum(s[:r]) for r in range(len(s))]
            cuts = [torch.sym_min(torch.sym_max(total - k - lo, 0), n) for lo, n in zip(los, s)]
            q = _coord(mesh)[1][i]
            head = (loc.narrow(d, 0, cuts[q]), tuple(lo + k for lo in los), tuple(cuts))
            tail = (loc.narrow(d, cuts[q], s[q] - cuts[q]),
                    tuple(lo + c + k - total for lo, c in zip(los, cuts)),
                    tuple(n - c for n, c in zip(s, cuts)))
            loc = move_rows([head, tail], d, s, mesh, i,  # the wrapped tail comes first
                            order=[(1, r) for r in range(len(s))] + [(0, r) for r in
                                                                     range(len(s))])
        return loc

    return Plan((), (), call, spec)


# ------------------------------------------------------------------ stack / unbind / repeat
@register_rule(aten.stack.default)
def _stack(func, args, kwargs) -> Plan:
    tensors = args[0]
    ref = next(t for t in tensors if type(t) is ShardTensor)
    d = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % (ref.ndim + 1)
    rs = ref._spec
    steps = []
    for j, t in enumerate(tensors):
        if type(t) is ShardTensor and same_layout(t._spec, rs):
            continue
        src = t._spec if type(t) is ShardTensor else _replicated(rs)
        steps.append(((0, j), ("respec", src, rs)))
    shape = list(rs.shape)
    shape.insert(d, len(tensors))
    pl = tuple(shard_like(p, p.dim + (p.dim >= d)) if isinstance(p, SHARDED) else p
               for p in rs.placements)
    return Plan(tuple(steps), (), None, make_spec(rs.mesh, pl, rs.sizes, tuple(shape)))


@register_rule(aten.unbind.int)
def _unbind(func, args, kwargs) -> Plan:
    x = args[0]
    d = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % x.ndim
    _check_free(x, [d], func)
    spec = x._spec
    pl = tuple(shard_like(p, p.dim - (p.dim > d)) if isinstance(p, SHARDED) else p
               for p in spec.placements)
    shape = tuple(s for k, s in enumerate(spec.shape) if k != d)
    out = make_spec(spec.mesh, pl, spec.sizes, shape)
    return Plan(outs=[out] * spec.shape[d])


@register_rule(aten.repeat.default)
def _repeat(func, args, kwargs) -> Plan:
    x, reps = args[0], list(args[1])
    spec = x._spec
    lead = len(reps) - x.ndim
    shape = [s * r for s, r in zip([1] * lead + list(spec.shape), reps)]
    pl = []
    for p in spec.placements:
        if isinstance(p, SHARDED):
            pl.append(shard_like(p, p.dim + lead, getattr(p, "blocks", 1) * reps[p.dim + lead]))
        elif isinstance(p, Partial):
            pl.append(p)  # repeat is linear
        else:
            pl.append(p)
    return Plan(outs=make_spec(spec.mesh, tuple(pl), spec.sizes, tuple(shape)))
