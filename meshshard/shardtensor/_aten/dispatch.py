"""The dispatch path of :class:`ShardTensor`: from an aten op to its rule's plan, executed.

Every aten op on a wrapper, forward or backward, comes here below autograd.
:func:`dispatch` finds the op's rule in the registry (its own, else the pointwise or fallback
slot), caches the rule's :class:`Plan` per input layout, and :func:`_execute` runs it: the
layout conversions of the local pieces (Partial -> Replicate with a per-tensor memo, narrowing,
respeccing), the local computation, and the wrapped outputs. Layout changes are invisible to
autograd, which differentiates the global computation. Collectives are functional
collectives, so the same code runs eagerly and under ``torch.compile`` (as graph nodes).

Also here: the layout conversions of local pieces and the small plan helpers that rules of
several families share. The rules themselves live in :mod:`meshshard.shardtensor.rules`, one
module per op family.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.errors import NoShardingRuleError
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


# ------------------------------------------------------------------ plan helpers for rules
def _spec_with(spec, placements, sizes, shape):
    return make_spec(spec.mesh, tuple(placements), tuple(sizes), tuple(shape))


def _moved(x, mapping: Callable[[int], int], out_shape) -> Plan:
    spec = x._spec
    pl = [shard_like(p, mapping(p.dim)) if isinstance(p, SHARDED) else p
          for p in spec.placements]
    return Plan(outs=_spec_with(spec, pl, spec.sizes, out_shape))


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


LATE.update(dispatch=dispatch, to_replicate_local=to_replicate_local)
