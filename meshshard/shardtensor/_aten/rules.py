"""The aten-level sharding rules for :class:`ShardTensor`.

Every aten op on a wrapper, forward or backward, comes here below autograd. Rules compute on
the local pieces and return wrappers; layout changes they need (Partial -> Replicate,
Replicate -> Shard) happen here too and are invisible to autograd, which differentiates the
global computation. Collectives are functional collectives, so the same code runs eagerly and
under ``torch.compile`` (as graph nodes).

Length (~970 lines): the dispatcher, the plan executor with its reduction memo, and the base
rules every other rule module builds on (pointwise, views, products, layout conversions): they
share the Plan record and the conversions, and change together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.errors import NoShardingRuleError
from meshshard.shardtensor._aten import rules_respec as _respec
from meshshard.shardtensor._aten.collective_ops import fc as _fc
from meshshard.shardtensor._aten.grid_halo import fetch, reshard_plan
from meshshard.shardtensor._aten.meshinfo import check
from meshshard.shardtensor._aten.meshinfo import coord as _coord
from meshshard.shardtensor._aten.no_rule import NoRuleError
from meshshard.shardtensor._aten.registry import (
    ATEN_RULES,
    DIRECT,
    FALLBACK,
    POINTWISE,
    POINTWISE_INPLACE,
    register_rule,
    rule_for,
)
from meshshard.shardtensor._aten.tensor import (
    LATE,
    SHARDED,
    ASpec,
    ShardTensor,
    make_spec,
    reduce_flattened,
    shard_like,
)

aten = torch.ops.aten
_REP = Replicate()
_PSUM = Partial()

class Plan(NamedTuple):
    """What a rule decided for one layout of its inputs; cached per (op, input specs, other
    arguments), so a repeated layer reuses it. ``steps``: ``(arg position, step)`` layout
    conversions of local pieces (``("reduce", mesh_dim)``, ``("narrow", mesh_dim, dim, sizes,
    blocks)``, ``("respec", from_spec, to_spec)``); ``overrides``: ``(position, value)``
    replacements of non-tensor arguments (local shapes); ``call``: the local computation (the
    op itself when None); ``outs``: the output spec, or a tuple of them (None: not wrapped)."""

    steps: tuple = ()
    overrides: tuple = ()
    call: Callable | None = None
    outs: Any = None


_PLANS: dict = {}
#: aten op -> the rule that serves it (its own, or a slot's), resolved on first use
_RESOLVED: dict = {}


def _resolve(func) -> Callable:
    fn = ATEN_RULES.get(func)
    if fn is None:
        fn = ATEN_RULES.get(func.overloadpacket)
    if fn is None:
        if torch.Tag.pointwise in func.tags:
            slot = POINTWISE_INPLACE if func._schema.name[-1] == "_" else POINTWISE
        else:
            slot = FALLBACK
        fn = ATEN_RULES.get(slot)
        if fn is None:
            raise NoRuleError(func)
    _RESOLVED[func] = fn
    return fn


def _deferred(func, fn) -> Callable:
    """The rule a plan rule that returned NotImplemented leaves the case to: the rule it
    extends, else the fallback."""
    entry = rule_for(func) or rule_for(func.overloadpacket)
    while entry is not None and entry.fn is not fn:
        entry = entry.base
    base = entry.base if entry is not None else None
    if base is not None:
        return base.fn
    fallback = ATEN_RULES.get(FALLBACK)
    if fallback is None or fallback is fn:
        raise NoRuleError(func)
    return fallback


def _key_of(a: Any) -> Any:
    t = type(a)
    if t is ShardTensor:
        return a._spec
    if t in (list, tuple):
        return tuple(_key_of(b) for b in a)
    if isinstance(a, torch.Tensor):
        return ("T", tuple(a.shape), a.dtype)
    return a


_SCALARS = (int, float, bool, type(None))


def dispatch(func, args: tuple, kwargs: dict) -> Any:
    tracing = False
    key_parts = [func]
    for a in args:
        t = type(a)
        if t is ShardTensor:
            if type(a._local) is not torch.Tensor:
                tracing = True
            key_parts.append(a._spec)
        elif t in _SCALARS:
            key_parts.append(a)
        else:
            key_parts.append(_key_of(a))
    if kwargs:
        key_parts.append(tuple((k, _key_of(v)) for k, v in kwargs.items()))
    plan = None
    key = None
    if not tracing:
        key = tuple(key_parts)
        try:
            plan = _PLANS.get(key)
        except TypeError:  # an unhashable argument: no cache
            key = None
    if plan is None:
        fn = _RESOLVED.get(func) or _resolve(func)
        if fn in DIRECT:
            return fn(func, args, kwargs)
        plan = fn(func, args, kwargs)
        while plan is NotImplemented:  # the rule leaves this case to its base (or the fallback)
            fn = _deferred(func, fn)
            if fn in DIRECT:
                return fn(func, args, kwargs)
            plan = fn(func, args, kwargs)
        if key is not None:
            if len(_PLANS) > 16384:
                _PLANS.clear()
            _PLANS[key] = plan
    return _execute(func, args, kwargs, plan)


def _execute(func, args: tuple, kwargs: dict, plan: Plan) -> Any:
    outs = plan.outs
    if not plan.steps and not plan.overrides and type(outs) is ASpec \
            and type(args[0]) is ShardTensor:
        # the common case (views, same-layout pointwise ops): no conversion, one output
        locs = [a._local if type(a) is ShardTensor else a for a in args]
        return ShardTensor((plan.call or func)(*locs, **kwargs), outs)
    locs = []
    mesh = None
    for a in args:
        t = type(a)
        if t is ShardTensor:
            locs.append(a._local)
            mesh = a._spec.mesh
        elif t in (list, tuple) and a and any(type(b) is ShardTensor for b in a):
            locs.append([b._local if type(b) is ShardTensor else b for b in a])
            mesh = next(b._spec.mesh for b in a if type(b) is ShardTensor)
        else:
            locs.append(a)
    steps = plan.steps
    if len(steps) > 1 and steps[1][1][0] == "reduce" and not func.is_view \
            and not func._schema.is_mutable:
        steps = _reduce_together(args, locs, steps, mesh)
    for pos, step in steps:
        if type(pos) is tuple:
            k, j = pos
            locs[k][j] = _apply_step(locs[k][j], step, mesh)
        elif step[0] == "reduce" and locs[pos] is args[pos]._local and not func.is_view \
                and not func._schema.is_mutable:  # (a memo must not be written or aliased)
            locs[pos] = _reduce_once(args[pos], step[1], mesh)
        else:
            locs[pos] = _apply_step(locs[pos], step, mesh)
    for pos, value in plan.overrides:
        locs[pos] = value
    out = (plan.call or func)(*locs, **kwargs)
    outs = plan.outs
    if type(outs) is tuple:
        return tuple(None if o is None or s is None else ShardTensor(o, s)
                     for o, s in zip(out, outs))
    if type(outs) is list:
        return [ShardTensor(o, s) for o, s in zip(out, outs)]
    return ShardTensor(out, outs)


def _reduce_together(args: tuple, locs: list, steps: tuple, mesh) -> tuple:
    """Operands of one op that are each only reduced over the same mesh dim (``a / b`` with
    both Partial) are summed in one collective, flattened together; returns the steps left."""
    count: dict = {}
    for pos, _ in steps:
        count[pos] = count.get(pos, 0) + 1
    group = [(pos, st[1]) for pos, st in steps if st[0] == "reduce" and type(pos) is int
             and count[pos] == 1 and locs[pos] is args[pos]._local]
    if len(group) < 2 or len({i for _, i in group}) != 1 \
            or len({locs[pos].dtype for pos, _ in group}) != 1:
        return steps
    i = group[0][1]
    todo = []
    for pos, _ in group:
        hit = _memo(args[pos], i)
        if hit is None:
            todo.append(pos)
        else:
            locs[pos] = hit
    if todo:
        summed = reduce_flattened([locs[pos] for pos in todo], mesh, (i,))
        for pos, t in zip(todo, summed):
            locs[pos] = t
            _remember(args[pos], i, t)
    done = {pos for pos, _ in group}
    return tuple(st for st in steps if st[0] not in done)


def _versions(a: ShardTensor) -> tuple | None:
    # the wrapper's counter (an in-place op on the wrapper changes the piece below the
    # ADInplaceOrView key: only the wrapper's moves) and the piece's (one through to_local()'s
    # view moves only that); None for an inference tensor (no counter: no memo)
    try:
        return (a._version, a._local._version)
    except RuntimeError:
        return None


def _memo(a: ShardTensor, i: int) -> torch.Tensor | None:
    memo = a.__dict__.get("_reduced")
    if memo is not None and memo[0] == i and memo[2] is a._local and memo[1] == _versions(a) \
            and memo[1] is not None:
        return memo[3]
    return None


def _remember(a: ShardTensor, i: int, out: torch.Tensor) -> None:
    v = _versions(a)
    if v is not None:
        a.__dict__["_reduced"] = (i, v, a._local, out)


def _reduce_once(a: ShardTensor, i: int, mesh) -> torch.Tensor:
    """``a``'s piece summed over mesh dim ``i``, computed once per tensor: a Partial that
    several ops consume (a gradient that both products of a backward read, a tensor saved for
    backward and reduced in forward) costs one collective. The memo lives on the wrapper and
    holds while its piece is the same object and unchanged (both version counters); every rank
    runs the same ops, so every rank hits or misses alike."""
    out = _memo(a, i)
    if out is None:
        out = _all_reduce(a._local, mesh, i)
        _remember(a, i, out)
    return out


def _apply_step(loc: torch.Tensor, step: tuple, mesh) -> torch.Tensor:
    kind = step[0]
    if kind == "reduce":
        return _all_reduce(loc, mesh, step[1])
    if kind == "narrow":
        _, i, ad, s, blocks = step
        return _narrow(loc, ad, s, _coord(mesh)[1][i], blocks)
    _, src, dst = step  # respec
    return respec_local(loc, src, dst)


def respec_local(loc: torch.Tensor, src, dst) -> torch.Tensor:
    """This rank's piece of ``dst`` from its piece of ``src``. Splits that differ only in the
    per-rank sizes (int sizes: eager, or specialised) move just the rows that change owner
    (one all-to-all per such mesh dim); anything else goes through the full tensor."""
    if src.placements == dst.placements and tuple(src.shape) == tuple(dst.shape) and all(
            type(v) is int for s in (*src.sizes, *dst.sizes) if s is not None for v in s) \
            and all(type(p) is Shard or src.sizes[i] == dst.sizes[i]
                    for i, p in enumerate(src.placements)):
        c = _coord(src.mesh)
        for i, p in enumerate(src.placements):
            if isinstance(p, Shard) and src.sizes[i] != dst.sizes[i]:
                ex = reshard_plan(p.dim, i, tuple(src.sizes[i]), tuple(dst.sizes[i]), c[1][i])
                loc = fetch(loc, ex, src.mesh, detail="rows that change owner", phase=None)
        return loc
    return from_replicate_local(to_replicate_local(loc, src), dst)


def _all_reduce(t: torch.Tensor, mesh, i: int) -> torch.Tensor:
    if mesh.size(i) == 1:
        return t
    check("all_reduce", mesh, i, t, "sum")
    name = _coord(mesh)[2][i]
    return _fc.wait_tensor(_fc.all_reduce(t.contiguous(), "sum", name))


LATE["all_reduce"] = _all_reduce


def _all_gather_v(t: torch.Tensor, dim: int, sizes: tuple, mesh, i: int,
                  blocks: int = 1) -> torch.Tensor:
    n = len(sizes)
    if n == 1:
        return t
    if blocks != 1:  # (.., m*n_r, ..) -> (.., m, n_r, ..), gather the n_r axis, merge back
        shape = list(t.shape)
        t = t.unflatten(dim, (blocks, -1))
        out = _all_gather_v(t, dim + 1, sizes, mesh, i)
        shape[dim] = blocks * sum(sizes)
        return out.reshape(shape)
    name = _coord(mesh)[2][i]
    m = max(sizes)
    x = t.movedim(dim, 0)
    pad = m - x.shape[0]  # no branch on it: a symbolic size stays unguarded
    x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
    check("all_gather", mesh, i, x, "uneven rows")
    g = _fc.wait_tensor(_fc.all_gather_into_tensor(x.contiguous(), n, name))
    pieces = [g.narrow(0, r * m, s) for r, s in enumerate(sizes)]
    return torch.cat(pieces).movedim(0, dim)


def to_replicate_local(local: torch.Tensor, spec) -> torch.Tensor:
    """The full tensor from a local piece (collective over non-Replicate mesh dims)."""
    for i, p in enumerate(spec.placements):
        if isinstance(p, Partial):
            local = _all_reduce(local, spec.mesh, i)
        elif isinstance(p, SHARDED):
            local = _all_gather_v(local, p.dim, spec.sizes[i], spec.mesh, i,
                                  getattr(p, "blocks", 1))
    return local


def from_replicate_local(full: torch.Tensor, spec) -> torch.Tensor:
    """This rank's piece of ``spec`` cut from a full (replicated) tensor. No collective.
    A Partial placement keeps the whole value on coordinate 0 and zeros elsewhere."""
    for i, p in enumerate(spec.placements):
        if isinstance(p, SHARDED):
            c = _coord(spec.mesh)[1][i]
            full = _narrow(full, p.dim, spec.sizes[i], c, getattr(p, "blocks", 1))
        elif isinstance(p, Partial) and _coord(spec.mesh)[1][i] != 0:
            full = torch.zeros_like(full)
    return full


def _narrow(t: torch.Tensor, dim: int, sizes: tuple, c: int, blocks: int = 1) -> torch.Tensor:
    """Rank ``c``'s rows of a full tensor ``t`` along ``dim`` (Shard, or Blocked: per block)."""
    off = sum(sizes[:c])
    if blocks == 1:
        return t.narrow(dim, off, sizes[c])
    shape = list(t.shape)
    shape[dim] = blocks * sizes[c]
    return t.unflatten(dim, (blocks, -1)).narrow(dim + 1, off, sizes[c]).reshape(shape)


def _local_shape(spec) -> list:
    shape = list(spec.shape)
    coord = _coord(spec.mesh)[1]
    for i, p in enumerate(spec.placements):
        if isinstance(p, SHARDED):
            shape[p.dim] = spec.sizes[i][coord[i]] * getattr(p, "blocks", 1)
    return shape


# ------------------------------------------------------------------ pointwise
_LINEAR_ALL = {aten.add.Tensor, aten.sub.Tensor, aten.neg.default, aten.clone.default,
               aten.add_.Tensor, aten.sub_.Tensor, aten.neg_.default}
_LINEAR_ONE = {aten.mul.Tensor, aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar,
               aten.mul_.Tensor, aten.div_.Tensor, aten.mul_.Scalar, aten.div_.Scalar}


# A Partial times another tensor is reduced at once rather than kept Partial: the lazy form
# multiplies collectives when the product fans out (the Transolver's slice tokens feed q, k and
# v; each would be reduced on its own, forward and backward). Sums of Partials and products
# with a number stay Partial (they merge or feed one consumer). In place ops keep the lazy
# rule (the reduced piece would not be the tensor written to).
_EAGER_ONE = {aten.mul.Tensor, aten.div.Tensor}
_SHIFTS = {aten.add.Tensor, aten.sub.Tensor, aten.add_.Tensor, aten.sub_.Tensor}


def _other_factor(args: tuple, k: int) -> bool:
    """Another operand than ``args[k]`` is a tensor of more than one element."""
    return any(j != k and isinstance(a, torch.Tensor) and a.numel() != 1
               for j, a in enumerate(args))


def _pointwise(func, args, kwargs) -> Plan:
    mesh = None
    tensors = []
    for a in args:
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            if mesh is None and type(a) is ShardTensor:
                mesh = a._spec.mesh
    _respec.check_same_mesh(func, args, mesh)
    shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))
    out_nd = len(shape)
    placements = []
    sizes = []
    steps = []
    shifted = []  # mesh dims on which a Partial is shifted by a number (see below)
    for i in range(mesh.ndim):
        shard = None
        partial_args = []
        for k, a in enumerate(args):
            if type(a) is not ShardTensor:
                continue
            p = a._spec.placements[i]
            if isinstance(p, SHARDED):
                od = p.dim + out_nd - a.ndim
                if a.shape[p.dim] == shape[od] and shard is None:
                    shard = (od, a._spec.sizes[i], p)
            elif isinstance(p, Partial):
                partial_args.append(k)
        if shard is not None:
            od, s, sp = shard
            blocks = getattr(sp, "blocks", 1)
            placements.append(shard_like(sp, od))
            sizes.append(s)
            for k, a in enumerate(args):
                if not isinstance(a, torch.Tensor):
                    continue
                p = a._spec.placements[i] if type(a) is ShardTensor else _REP
                ad = od - (out_nd - a.ndim)
                if isinstance(p, SHARDED):
                    if p.dim != ad or type(p) is not type(sp) \
                            or getattr(p, "blocks", 1) != blocks:
                        raise _respec.mismatch(func, i, (od, sp, s),
                                               (p.dim + out_nd - a.ndim, p, a._spec.sizes[i]))
                    if a._spec.sizes[i] != s:  # same dim, other boundaries: move rows
                        steps.append((k, _respec.resize_step(func, a._spec, i, p.dim,
                                                             a._spec.sizes[i], s)))
                    continue
                if isinstance(p, Partial):
                    steps.append((k, ("reduce", i)))
                if ad >= 0 and a.shape[ad] != 1:
                    steps.append((k, ("narrow", i, ad, s, blocks)))
            continue
        if partial_args:
            # sum-linear: every operand Partial (a scalar added on each rank would count P
            # times), or one Partial factor
            n_operands = 1 if func in (aten.neg.default, aten.clone.default,
                                       aten.neg_.default) else 2
            linear = (func in _LINEAR_ALL and len(partial_args) == n_operands) or (
                func in _LINEAR_ONE and len(partial_args) == 1
                and (func not in (aten.div.Tensor, aten.div_.Tensor) or partial_args[0] == 0)
                and not (func in _EAGER_ONE and _other_factor(args, partial_args[0]))
            )
            if not linear and func in _SHIFTS and partial_args == [0] and len(args) > 1 \
                    and type(args[1]) in (int, float):
                # a Partial plus a number stays Partial: the number is added on coordinate 0
                # only (the sum then holds it once); saves a collective that the next
                # consumer may share with another operand's (``t / (n + eps)``)
                shifted.append(i)
                linear = True
            if linear:
                placements.append(_PSUM)
                sizes.append(None)
                continue
            for k in partial_args:
                steps.append((k, ("reduce", i)))
        placements.append(_REP)
        sizes.append(None)
    steps.sort(key=lambda st: st[1][0] != "reduce")  # reduce before narrowing
    coord = _coord(mesh)[1]
    overrides = ((1, type(args[1])(0)),) if any(coord[i] for i in shifted) else ()
    return Plan(tuple(steps), overrides, None,
                make_spec(mesh, tuple(placements), tuple(sizes), shape))


register_rule(POINTWISE)(_pointwise)
# in-place pointwise ops: the same plan, applied in place (rules_inplace extends this)
register_rule(POINTWISE_INPLACE)(_pointwise)


# ------------------------------------------------------------------ same layout
@register_rule(aten.detach.default, aten.alias.default, aten._to_copy.default)
def _same(func, args, kwargs) -> Plan:
    return Plan(outs=args[0]._spec)


@register_rule(aten.ones_like.default, aten.zeros_like.default, aten.empty_like.default,
      aten.full_like.default)
def _like(func, args, kwargs) -> Plan:
    spec = args[0]._spec
    if any(isinstance(p, Partial) for p in spec.placements):  # a Partial of ones is not ones
        pl = tuple(_REP if isinstance(p, Partial) else p for p in spec.placements)
        spec = make_spec(spec.mesh, pl, spec.sizes, spec.shape)
    return Plan(outs=spec)


@register_rule(aten._local_scalar_dense.default, direct=True)
def _item(func, args, kwargs):
    x = args[0]
    return func(to_replicate_local(x._local, x._spec))


@register_rule(aten.is_same_size.default, direct=True)
def _same_size(func, args, kwargs):
    return tuple(args[0].shape) == tuple(args[1].shape)



# ------------------------------------------------------------------ reductions
def _reduce_rule(func, args, kwargs, mean: bool, default: bool) -> Plan:
    x = args[0]
    spec = x._spec
    nd = x.ndim
    dims = None if default else (args[1] if len(args) > 1 else None)
    keepdim = False if default else (args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(nd))
    dims = sorted({(d + nd) % nd for d in ([dims] if isinstance(dims, int) else dims)})
    placements, sizes = [], []
    over_shard = False
    for i, p in enumerate(spec.placements):
        if isinstance(p, SHARDED):
            if p.dim in dims:
                placements.append(_PSUM)
                sizes.append(None)
                over_shard = True
            else:
                nd_out = p.dim if keepdim else p.dim - sum(1 for d in dims if d < p.dim)
                placements.append(shard_like(p, nd_out))
                sizes.append(spec.sizes[i])
        else:
            placements.append(p)
            sizes.append(None)
    out_shape = [s for d, s in enumerate(spec.shape) if d not in dims] if not keepdim else [
        1 if d in dims else s for d, s in enumerate(spec.shape)]
    out = make_spec(spec.mesh, tuple(placements), tuple(sizes), tuple(out_shape))
    call = None
    if mean and over_shard:  # local sum / global count
        count = 1
        for d in dims:
            count = count * spec.shape[d]

        def call(loc, *_a, dtype=None, **_k):
            return aten.sum.dim_IntList(loc, dims, keepdim, dtype=dtype) / count

    return Plan((), (), call, out)


@register_rule(aten.sum.dim_IntList, aten.sum.default)
def _sum(func, args, kwargs) -> Plan:
    return _reduce_rule(func, args, kwargs, False, func is aten.sum.default)


@register_rule(aten.mean.dim, aten.mean.default)
def _mean(func, args, kwargs) -> Plan:
    return _reduce_rule(func, args, kwargs, True, func is aten.mean.default)


# ------------------------------------------------------------------ views
def _spec_with(spec, placements, sizes, shape):
    return make_spec(spec.mesh, tuple(placements), tuple(sizes), tuple(shape))


def _moved(x, mapping: Callable[[int], int], out_shape) -> Plan:
    spec = x._spec
    pl = [shard_like(p, mapping(p.dim)) if isinstance(p, SHARDED) else p
          for p in spec.placements]
    return Plan(outs=_spec_with(spec, pl, spec.sizes, out_shape))


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


def _infer(shape, numel):
    shape = list(shape)
    if -1 in shape:
        k = shape.index(-1)
        rest = 1
        for j, s in enumerate(shape):
            if j != k:
                rest = rest * s
        shape[k] = numel // rest
    return shape


def _reshape(loc, shape, *_a, **_k):
    # the wrapper claims contiguous strides; the local piece may be a permuted view
    return loc.reshape(shape)


def view_plan(x: ShardTensor, shape: Any, place: Callable) -> Plan | None:
    """The plan of a view of ``x`` as ``shape`` that moves nothing: every sharded mesh dim
    ``i`` (placement ``p``, flat stride ``sigma`` of its dim) lands where ``place(in_shape,
    out_shape, i, p, sigma)`` says, ``(out dim, blocks, per-rank sizes)``; None when ``place``
    returns None for one of them."""
    spec = x._spec
    in_shape = list(x.shape)
    numel = 1
    for s in in_shape:
        numel = numel * s
    out_shape = _infer(shape, numel)
    placements, sizes = [], []
    local_out = list(out_shape)
    for i, p in enumerate(spec.placements):
        if not isinstance(p, SHARDED):
            placements.append(p)
            sizes.append(None)
            continue
        sigma = 1
        for t in in_shape[p.dim + 1:]:
            sigma = sigma * t
        found = place(in_shape, out_shape, i, p, sigma)
        if found is None:
            return None
        od, blocks, s = found
        placements.append(shard_like(p, od, blocks))
        sizes.append(s)
        local_out[od] = s[_coord(spec.mesh)[1][i]] * blocks
    return Plan((), ((1, local_out),), _reshape,
                _spec_with(spec, placements, sizes, out_shape))


@register_rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(func, args, kwargs) -> Plan:
    spec = args[0]._spec

    def place(in_shape, out_shape, i, p, sigma):
        found = _map_view_dim(out_shape, sigma, extent(spec, i))
        if found is None:
            msg = (
                f"{func}: reshape {tuple(in_shape)} -> {tuple(out_shape)} splits the sharded "
                f"dim {p.dim} (needs a redistribution first)"
            )
            raise NotImplementedError(msg)
        od, blocks, q = found
        return od, blocks, spec.sizes[i] if q == 1 else tuple(v * q for v in spec.sizes[i])

    return view_plan(args[0], args[1], place)


def extent(spec, i: int):
    """The extent of mesh dim ``i``'s sharded coordinate: the sum of its sizes, read from the
    global shape (under tracing the global shape and the per-rank sizes are separate symbols;
    ``N // N`` simplifies where ``N // sum(sizes)`` would guard)."""
    p = spec.placements[i]
    return spec.shape[p.dim] // getattr(p, "blocks", 1)


def _map_view_dim(outs: list, sigma, n):
    """Where a sharded coordinate of extent ``n`` and flat stride ``sigma`` lands in a view of
    shape ``outs``: (dim, blocks, q) when that dim's index is ``block * n * q + i * q + j``
    (the rows of every rank stay whole), else None."""
    stride = 1
    strides = []
    for s in reversed(outs):
        strides.append(stride)
        stride = stride * s
    strides.reverse()
    for od, (s, st) in enumerate(zip(outs, strides)):
        if s == 1 and n != 1:
            continue
        if st <= sigma < st * s or (n == 1 and st == sigma):
            if sigma % st:
                return None
            q = sigma // st
            if s % (n * q):
                return None
            return od, s // (n * q), q
    return None


# ------------------------------------------------------------------ matmul family
def _contract(func, args, labels: tuple, out_labels: str, tensor_pos: tuple):
    """Placement rule for products: per mesh dim, a label sharded on some operand is sharded
    in the output, or (contracted) makes it Partial. Returns (steps, out spec)."""
    ops = [args[k] for k in tensor_pos]
    mesh = next(a._spec.mesh for a in ops if type(a) is ShardTensor)
    steps = []
    placements, sizes = [], []
    dimsize = {}
    for a, lab in zip(ops, labels):
        for L, s in zip(lab, a.shape):
            dimsize[L] = s
    shape = [dimsize[L] for L in out_labels]
    for i in range(mesh.ndim):
        sharded = None
        partial = []
        for k, (a, lab) in enumerate(zip(ops, labels)):
            if type(a) is not ShardTensor:
                continue
            p = a._spec.placements[i]
            if isinstance(p, SHARDED) and sharded is None:
                sharded = (lab[p.dim], a._spec.sizes[i], p)
            elif isinstance(p, Partial):
                partial.append(k)
        if sharded is not None:
            L, s, sp = sharded
            blocks = getattr(sp, "blocks", 1)
            for k, (a, lab) in enumerate(zip(ops, labels)):
                p = a._spec.placements[i] if type(a) is ShardTensor else _REP
                if isinstance(p, Partial):
                    steps.append((tensor_pos[k], ("reduce", i)))
                    p = _REP
                if isinstance(p, SHARDED):
                    if lab[p.dim] != L or a._spec.sizes[i] != s or p != sp and \
                            getattr(p, "blocks", 1) != blocks:
                        msg = f"{func}: operands sharded on different dims of mesh dim {i}"
                        raise NotImplementedError(msg)
                elif L in lab:
                    steps.append((tensor_pos[k], ("narrow", i, lab.index(L), s, blocks)))
            if L in out_labels:
                placements.append(shard_like(sp, out_labels.index(L)))
                sizes.append(s)
            else:
                placements.append(_PSUM)
                sizes.append(None)
        else:  # a Partial factor is reduced first (one collective however the product
            # fans out; see _EAGER_ONE)
            for k in partial:
                steps.append((tensor_pos[k], ("reduce", i)))
            placements.append(_REP)
            sizes.append(None)
    steps.sort(key=lambda st: st[1][0] != "reduce")
    return tuple(steps), make_spec(mesh, tuple(placements), tuple(sizes), tuple(shape))


#: the two-operand products and their index labels (operands, output); rules_shape adds
#: mv and dot
PRODUCTS: dict = {aten.mm.default: (("mk", "kn"), "mn"),
                  aten.bmm.default: (("bmk", "bkn"), "bmn")}


def product(func, args, kwargs) -> Plan:
    """A product of :data:`PRODUCTS` by its labels (see :func:`_contract`)."""
    labels, out = PRODUCTS[func]
    steps, spec = _contract(func, args, labels, out, (0, 1))
    return Plan(steps, (), None, spec)


register_rule(*PRODUCTS)(product)


@register_rule(aten.addmm.default)
def _addmm(func, args, kwargs) -> Plan:
    steps, spec = _contract(aten.mm.default, args, ("mk", "kn"), "mn", (1, 2))
    bias = args[0]
    if type(bias) is ShardTensor and any(not isinstance(p, Replicate)
                                             for p in bias._spec.placements):
        msg = f"{func}: a sharded or partial bias (not supported)"
        raise NotImplementedError(msg)
    partial = [i for i, p in enumerate(spec.placements) if isinstance(p, Partial)]
    if not partial:
        return Plan(steps, (), None, spec)
    mesh = spec.mesh

    def call(b, m1, m2, beta=1, alpha=1):  # reduce the product before adding the bias once
        prod = aten.mm.default(m1, m2)
        for i in partial:
            prod = _all_reduce(prod, mesh, i)
        return beta * b + alpha * prod

    out = make_spec(mesh, tuple(_REP if isinstance(p, Partial) else p
                                for p in spec.placements), spec.sizes, spec.shape)
    return Plan(steps, (), call, out)


# ------------------------------------------------------------------ nn
def _check_free(x, dims, func):
    for p in x._spec.placements:
        if isinstance(p, SHARDED) and p.dim in dims:
            msg = (f"{func} over the sharded dim {p.dim} has no sharding rule; redistribute "
                   "that dim to Replicate() (or shard another dim) first")
            raise NoShardingRuleError(msg)


def _reduced(x, pos: int):
    """(steps, spec) turning ``x``'s Partial placements into Replicate."""
    spec = x._spec
    steps = tuple((pos, ("reduce", i)) for i, p in enumerate(spec.placements)
                  if isinstance(p, Partial))
    if steps:
        spec = make_spec(spec.mesh, tuple(_REP if isinstance(p, Partial) else p
                                          for p in spec.placements), spec.sizes, spec.shape)
    return steps, spec


def _to_spec(x, pos: int, spec) -> tuple:
    """Steps that bring ``x`` (a wrapper or a plain, replicated tensor) to ``spec``."""
    if type(x) is not ShardTensor:
        return ((pos, ("respec", _replicated(spec), spec)),)
    if same_layout(x._spec, spec):
        return ()
    return ((pos, ("respec", x._spec, spec)),)


def same_layout(a, b) -> bool:
    """Structural equality (specs are interned in eager mode, but not while tracing, where the
    sizes are SymInts: equal ones compare equal under a guard that holds by construction)."""
    return a is b or (a.placements == b.placements and a.sizes == b.sizes
                      and a.shape == b.shape)


def _replicated(spec):
    return make_spec(spec.mesh, (_REP,) * len(spec.placements), (None,) * len(spec.sizes),
                     spec.shape)


@register_rule(aten._softmax.default, aten._log_softmax.default)
def _softmax(func, args, kwargs) -> Plan:
    x = args[0]
    _check_free(x, [args[1] % x.ndim], func)
    steps, spec = _reduced(x, 0)
    return Plan(steps, (), None, spec)


@register_rule(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def _softmax_bwd(func, args, kwargs) -> Plan:
    out = args[1]
    _check_free(out, [args[2] % out.ndim], func)
    return Plan(_to_spec(args[0], 0, out._spec), (), None, out._spec)


@register_rule(aten.native_layer_norm.default)
def _layer_norm(func, args, kwargs) -> Plan:
    x, nshape = args[0], args[1]
    axis = x.ndim - len(nshape)
    _check_free(x, list(range(axis, x.ndim)), func)
    steps, spec = _reduced(x, 0)
    stat_shape = list(spec.shape[:axis]) + [1] * (x.ndim - axis)
    sspec = make_spec(spec.mesh, spec.placements, spec.sizes, tuple(stat_shape))
    return Plan(steps, (), None, (spec, sspec, sspec))


@register_rule(aten.native_layer_norm_backward.default)
def _layer_norm_bwd(func, args, kwargs) -> Plan:
    g, x, w, b = args[0], args[1], args[5], args[6]
    spec = x._spec
    pl = tuple(_PSUM if isinstance(p, SHARDED) else p for p in spec.placements)
    none = (None,) * spec.mesh.ndim
    outs = (spec,) + tuple(None if ref is None else make_spec(spec.mesh, pl, none,
                                                              tuple(ref.shape))
                           for ref in (w, b))
    return Plan(_to_spec(g, 0, spec), (), None, outs)


@register_rule(aten.cat.default)
def _cat(func, args, kwargs) -> Plan:
    tensors = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    ref = next(t for t in tensors if type(t) is ShardTensor)
    dim = dim % ref.ndim
    _check_free(ref, [dim], func)
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


@register_rule(aten.select.int)
def _select(func, args, kwargs) -> Plan:
    x, dim = args[0], args[1] % args[0].ndim
    _check_free(x, [dim], func)
    shape = [s for k, s in enumerate(x.shape) if k != dim]
    return _moved(x, lambda k: k - (k > dim), shape)


@register_rule(aten.slice_backward.default)
def _slice_bwd(func, args, kwargs) -> Plan:
    g, sizes, dim = args[0], list(args[1]), args[2] % len(args[1])
    _check_free(g, [dim], func)
    local = list(_local_shape(g._spec))
    local[dim] = sizes[dim]
    return Plan((), ((1, local),), None,
                _spec_with(g._spec, g._spec.placements, g._spec.sizes, sizes))


def _fill_local(x: ShardTensor, value) -> None:
    """In place: every element ``value`` (a Partial dim keeps it on coordinate 0 only)."""
    coord = _coord(x._spec.mesh)[1]
    keep = all(c == 0 for p, c in zip(x._spec.placements, coord) if isinstance(p, Partial))
    x._local.fill_(value if keep else 0)


@register_rule(aten.fill_.Scalar, aten.zero_.default, direct=True)
def _fill(func, args, kwargs):
    x = args[0]
    _fill_local(x, args[1] if func is aten.fill_.Scalar else 0)
    return x



LATE.update(dispatch=dispatch, to_replicate_local=to_replicate_local)
