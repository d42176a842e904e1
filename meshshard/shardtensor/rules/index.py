"""Aten rules: indexing.

* ``index`` / ``index_put`` (advanced indexing): integer index tensors (plain or Replicate) on
  unsharded dims; the sharded dim keeps its rows and moves to its place in the result. Local.
* ``index_select`` / ``index_add`` / ``gather`` / ``scatter`` / ``scatter_add`` /
  ``scatter_reduce`` along an unsharded dim; every tensor operand in the reference layout (a
  plain or Replicate operand is narrowed to this rank's rows; no data moves). Local.
* ``masked_fill`` (tensor value, in-place), ``where``: pointwise with broadcasting.
* slices and ``select``: :mod:`meshshard.shardtensor.rules.slice`.
* ``new_zeros`` / ``new_ones`` / ``new_full`` / ``new_empty``: the source's layout where the new
  shape keeps its sharded extents (the backward of gather/index/max), else Replicate.

Index tensors on the sharded dim (data-dependent output sizes) and sharded index tensors are
refused with an error naming the op and the layout.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial, Replicate

from meshshard.shardtensor._aten import dispatch as _R
from meshshard.shardtensor._aten.dispatch import (
    _REP,
    SHARDED,
    Plan,
    ShardTensor,
    _coord,
    _local_shape,
    make_spec,
    shard_like,
)
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor.rules.pointwise import _pointwise

aten = torch.ops.aten


def _err(func, what, spec=None):
    msg = f"{func}: {what}" + (f" (layout {spec})" if spec is not None else "")
    raise NotImplementedError(msg)


def _placement(t, i):
    return t._spec.placements[i] if type(t) is ShardTensor else _REP


def align(func, args, positions, free: list[int]) -> tuple[tuple, object]:
    """Steps bringing the tensors at ``positions`` (same ndim) to one layout, and that layout's
    spec with the shape of ``args[positions[0]]``. A sharded dim in ``free`` (the op's own dim)
    is refused; Partials are reduced; Replicate operands are narrowed to this rank's rows."""
    ts = [(k, args[k]) for k in positions if isinstance(args[k], torch.Tensor)]
    mesh = next(t._spec.mesh for _, t in ts if type(t) is ShardTensor)
    steps, placements, sizes = [], [], []
    for i in range(mesh.ndim):
        ref = None
        for _, t in ts:
            p = _placement(t, i)
            if isinstance(p, SHARDED):
                ref = (p, t._spec.sizes[i], t.shape[p.dim])
                break
        for k, t in ts:
            p = _placement(t, i)
            if isinstance(p, Partial):
                steps.append((k, ("reduce", i)))
                p = _REP
            if ref is None:
                continue
            rp, rs, rn = ref
            if rp.dim in free:
                _err(func, f"along the sharded dim {rp.dim} (index tensors on a sharded dim "
                     "have data-dependent sizes; not supported)", t._spec
                     if type(t) is ShardTensor else None)
            if isinstance(p, SHARDED):
                if p != rp or t._spec.sizes[i] != rs:
                    _err(func, f"operands sharded differently on mesh dim {i}", t._spec)
            elif t.ndim == 0:
                continue
            elif t.shape[rp.dim] == rn:
                steps.append((k, ("narrow", i, rp.dim, rs, getattr(rp, "blocks", 1))))
            else:
                _err(func, f"a replicated operand of extent {t.shape[rp.dim]} on the sharded "
                     f"dim {rp.dim} (extent {rn})")
        placements.append(_REP if ref is None else ref[0])
        sizes.append(None if ref is None else ref[1])
    steps.sort(key=lambda st: st[1][0] != "reduce")
    shape = tuple(args[positions[0]].shape)
    return tuple(steps), make_spec(mesh, tuple(placements), tuple(sizes), shape)


# ------------------------------------------------------------------ factories
@register_rule(aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default,
      aten.new_full.default)
def _new(func, args, kwargs) -> Plan:
    x, size = args[0], list(args[1])
    spec = x._spec
    keep = len(size) == x.ndim and all(
        size[p.dim] == x.shape[p.dim] for p in spec.placements if isinstance(p, SHARDED))
    if keep:
        pl = tuple(_REP if isinstance(p, Partial) else p for p in spec.placements)
        out = make_spec(spec.mesh, pl, spec.sizes, tuple(size))
    else:
        out = _R._replicated(make_spec(spec.mesh, spec.placements, spec.sizes, tuple(size)))
    return Plan((), ((1, _local_shape(out)),), None, out)


# ------------------------------------------------------------------ along an unsharded dim
def _dim_op(func, args, positions, dim_pos=1) -> Plan:
    d = args[dim_pos] % max(args[0].ndim, 1)
    steps, spec = align(func, args, positions, [d])
    return Plan(steps, (), None, spec)


def _owner_split(func, args, d, idx_pos):
    """Mesh dims sharding ``args[0]`` on dim ``d`` (the op's own dim), with the index at
    ``idx_pos`` replicated on them: each rank picks the indexed rows it owns, zeros elsewhere,
    so the result is Partial there and nothing moves. Returns (mesh dims, args for align with
    those placements hidden)."""
    x, index = args[0], args[idx_pos]
    spec = x._spec
    over = [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED) and p.dim == d]
    for i in over:
        if getattr(spec.placements[i], "blocks", 1) != 1:
            _err(func, f"along the blocked dim {spec.placements[i]}", spec)
        if not isinstance(_placement(index, i), Replicate):
            _err(func, f"a sharded index along the sharded dim {d}", index._spec)
    return over


def _owned(loc, d, index, spec, over, pick):
    """``pick(local source, local index)`` with rows of ``d`` owned by this rank; others 0."""
    keep = None
    for i in over:
        s = spec.sizes[i]
        c = _coord(spec.mesh)[1][i]
        lo = sum(s[:c])
        shape = list(loc.shape)
        shape[d] = 1
        loc = torch.cat([loc, loc.new_zeros(shape)], d)  # a row to point at when not ours
        mine = (index >= lo) & (index < lo + s[c])
        index = torch.where(mine, index - lo, torch.full_like(index, s[c]))
        keep = mine if keep is None else keep & mine
    out = pick(loc, index)
    return out, keep


def _hidden(args, over):
    """``args[0]`` seen with the mesh dims in ``over`` Replicate (for align's other dims)."""
    x = args[0]
    spec = x._spec
    pl = tuple(_REP if i in over else p for i, p in enumerate(spec.placements))
    sz = tuple(None if i in over else v for i, v in enumerate(spec.sizes))
    fake = ShardTensor(x._local, make_spec(spec.mesh, pl, sz, spec.shape))
    return (fake, *args[1:]), spec


def _partial_on(spec, over):
    pl = tuple(Partial() if i in over else p for i, p in enumerate(spec.placements))
    sz = tuple(None if i in over else v for i, v in enumerate(spec.sizes))
    return make_spec(spec.mesh, pl, sz, spec.shape)


@register_rule(aten.gather.default)
def _gather(func, args, kwargs) -> Plan:
    d = args[1] % max(args[0].ndim, 1)
    over = _owner_split(func, args, d, 2)
    hid, xspec = _hidden(args, over) if over else (args, None)
    steps, spec = align(func, hid, (0, 2), [d])
    shape = tuple(args[2].shape)  # the result has the index's shape
    spec = make_spec(spec.mesh, spec.placements, spec.sizes, shape)
    if not over:
        return Plan(steps, (), None, spec)

    def call(loc, dim, index, *_a, **_k):
        out, keep = _owned(loc, d, index, xspec, over,
                           lambda src, ix: aten.gather.default(src, d, ix))
        return torch.where(keep, out, torch.zeros_like(out))

    return Plan(steps, (), call, _partial_on(spec, over))


@register_rule(aten.scatter.src, aten.scatter.value, aten.scatter_add.default,
               aten.scatter_reduce.two, aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter(func, args, kwargs) -> Plan:
    return _dim_op(func, args, (0, 2, 3))


@register_rule(aten.index_add.default)
def _index_add(func, args, kwargs) -> Plan:
    d = args[1] % max(args[0].ndim, 1)
    _plain_index(func, args[2])
    steps, spec = align(func, args, (0, 3), [d])
    return Plan(steps, (), None, spec)


@register_rule(aten.index_select.default)
def _index_select(func, args, kwargs) -> Plan:
    x, d, index = args[0], args[1] % max(args[0].ndim, 1), args[2]
    _plain_index(func, index)
    over = _owner_split(func, args, d, 2)
    hid, xspec = _hidden(args, over) if over else (args, None)
    steps, spec = align(func, hid, (0,), [d])
    shape = list(x.shape)
    shape[d] = index.numel()
    spec = make_spec(spec.mesh, spec.placements, spec.sizes, tuple(shape))
    if not over:
        return Plan(steps, (), _unwrap_call(func, (2,)), spec)

    def call(loc, dim, index, *_a, **_k):
        index = index._local if type(index) is ShardTensor else index
        out, keep = _owned(loc, d, index, xspec, over,
                           lambda src, ix: aten.index_select.default(src, d, ix))
        view = [1] * out.ndim
        view[d] = -1
        return torch.where(keep.reshape(view), out, torch.zeros_like(out))

    return Plan(steps, (), call, _partial_on(spec, over))


def _plain_index(func, t):
    if type(t) is ShardTensor and any(not isinstance(p, Replicate)
                                          for p in t._spec.placements):
        _err(func, "a sharded or partial index tensor (use meshshard.ops for row fetches)",
             t._spec)


def _unwrap_call(func, positions):
    def call(*locs, **kw):
        locs = list(locs)
        for k in positions:
            v = locs[k]
            if type(v) is ShardTensor:
                locs[k] = v._local
            elif isinstance(v, (list, tuple)):
                locs[k] = [b._local if type(b) is ShardTensor else b for b in v]
        return func(*locs, **kw)

    return call


@register_rule(aten.masked_fill.Tensor)
def _masked_fill(func, args, kwargs) -> Plan:
    return _pointwise(func, args, kwargs)


def _inplace(plan_rule):
    """An in-place op: the out-of-place rule's plan, run on the locals (mutating ``self``'s
    local piece), returning ``self``. Refused when ``self``'s layout would have to change."""

    def run(func, args, kwargs):
        plan = plan_rule(func, args, kwargs)
        if type(args[0]) is not ShardTensor or any(
                pos == 0 for pos, _ in plan.steps) or not _R.same_layout(plan.outs,
                                                                         args[0]._spec):
            spec = args[0]._spec if type(args[0]) is ShardTensor else "a plain tensor"
            _err(func, f"in place on {spec}, whose layout the result does not have "
                 "(use the out-of-place op)")
        _R._execute(func, args, kwargs, plan)
        return args[0]

    return run


for _op, _fn in ((aten.masked_fill_.Scalar, _pointwise), (aten.masked_fill_.Tensor, _pointwise),
                 (aten.scatter_.src, _scatter), (aten.scatter_.value, _scatter),
                 (aten.scatter_add_.default, _scatter),
                 (aten.scatter_reduce_.two, _scatter), (aten.index_add_.default, _index_add)):
    register_rule(_op, direct=True)(_inplace(_fn))


# ------------------------------------------------------------------ advanced indexing
def _adv_layout(func, x_nd: int, indices) -> tuple[list, int, object]:
    """(indexed dims, result ndim, map from an unindexed input dim to its result dim)."""
    adv = [k for k, t in enumerate(indices) if t is not None]
    for k in adv:
        t = indices[k]
        if t.dtype == torch.bool:
            _err(func, "a boolean mask index (data-dependent sizes; use torch.where)")
        _plain_index(func, t)
    nb = len(torch.broadcast_shapes(*(indices[k].shape for k in adv)))
    adjacent = adv == list(range(adv[0], adv[-1] + 1))

    def out_dim(p):
        if adjacent:
            return p if p < adv[0] else p - len(adv) + nb
        return nb + sum(1 for k in range(p) if k not in adv)

    return adv, x_nd - len(adv) + nb, out_dim


@register_rule(aten.index.Tensor)
def _index(func, args, kwargs) -> Plan:
    x, indices = args[0], list(args[1])
    steps, spec = _R._reduced(x, 0)
    adv, _, out_dim = _adv_layout(func, x.ndim, indices)
    for p in spec.placements:
        if isinstance(p, SHARDED) and p.dim in adv:
            _err(func, f"an index tensor on the sharded dim {p.dim}", spec)
    with torch._C.DisableTorchFunctionSubclass():
        shape = _index_shape(x.shape, indices)
    pl = tuple(shard_like(p, out_dim(p.dim)) if isinstance(p, SHARDED) else p
               for p in spec.placements)
    return Plan(steps, (), _unwrap_call(func, (1,)),
                make_spec(spec.mesh, pl, spec.sizes, tuple(shape)))


def _index_shape(shape, indices) -> list:
    """The result shape of advanced indexing, from shapes alone."""
    adv = [k for k, t in enumerate(indices) if t is not None]
    b = list(torch.broadcast_shapes(*(indices[k].shape for k in adv)))
    rest = [s for k, s in enumerate(shape) if k not in adv]
    if adv == list(range(adv[0], adv[-1] + 1)):
        return list(shape[: adv[0]]) + b + list(shape[adv[-1] + 1:])
    return b + rest


@register_rule(aten.index_put.default)
def _index_put(func, args, kwargs) -> Plan:
    x, indices, values = args[0], list(args[1]), args[2]
    adv, res_nd, out_dim = _adv_layout(func, x.ndim, indices)
    mesh = (x if type(x) is ShardTensor else values)._spec.mesh
    steps = []
    placements, sizes = [], []
    for i in range(mesh.ndim):
        px, pv = _placement(x, i), _placement(values, i)
        for k, p in ((0, px), (2, pv)):
            if isinstance(p, Partial):
                steps.append((k, ("reduce", i)))
        if isinstance(px, SHARDED):
            if px.dim in adv:
                _err(func, f"an index tensor on the sharded dim {px.dim}", x._spec)
            sp, s, pdim = px, x._spec.sizes[i], px.dim
        elif isinstance(pv, SHARDED):
            vd = pv.dim + res_nd - values.ndim
            inv = [p for p in range(x.ndim) if p not in adv and out_dim(p) == vd]
            if not inv:
                _err(func, "values sharded on an indexed dim", values._spec)
            sp, s, pdim = pv, values._spec.sizes[i], inv[0]
            steps.append((0, ("narrow", i, pdim, s, getattr(pv, "blocks", 1))))
        else:
            placements.append(_REP)
            sizes.append(None)
            continue
        vd = out_dim(pdim) - (res_nd - values.ndim)
        if isinstance(pv, SHARDED):
            if pv.dim != vd or values._spec.sizes[i] != s:
                _err(func, f"values sharded differently from the target on mesh dim {i}",
                     values._spec)
        elif vd >= 0 and values.shape[vd] != 1:
            steps.append((2, ("narrow", i, vd, s, getattr(sp, "blocks", 1))))
        placements.append(shard_like(sp, pdim))
        sizes.append(s)
    steps.sort(key=lambda st: st[1][0] != "reduce")
    out = make_spec(mesh, tuple(placements), tuple(sizes), tuple(x.shape))
    return Plan(tuple(steps), (), _unwrap_call(func, (1,)), out)


register_rule(aten.index_put_.default, aten._index_put_impl_.default,
              direct=True)(_inplace(_index_put))
