"""Pointwise ops: every aten op tagged pointwise without a rule of its own, out of place and
in place, and the ops that keep their input's layout (``detach``, ``*_like``, ``fill_``).

Out of place (:data:`POINTWISE`): per mesh dim, a sharded operand shards the output (the other
operands are narrowed to this rank's rows; one sharded on the same dim with other boundaries
is respecced); Partial operands stay Partial where the op is linear in them (sums of Partials,
one Partial factor times a number), else they are reduced first. A Partial plus a number stays
Partial with the number added on coordinate 0 only.

In place (:data:`POINTWISE_INPLACE`, ``add_``, ``div_``, ``mul_``, ...): the caller keeps
``self`` (torch returns the argument, not what dispatch returns), so ``self`` itself must hold
the result. The out-of-place plan may change ``self``'s layout: a Partial ``self`` divided by a
Replicate tensor is summed first; a Replicate ``self`` times a sharded tensor keeps only this
rank's rows. torch's own backward formulas do this on fresh tensors
(``layer_norm_double_backward``: ``sum(...).div_(N)``). The rule runs the plan on the converted
local and points ``self`` at the result and its layout; the global value is the one the op
defines. Linear ops keep a Partial ``self`` Partial, so nothing moves for those. Other views of
``self``'s old local piece do not see a layout change (they keep their own layout, and an
all-reduced or narrowed piece is a new buffer); with no layout change the op runs on the local
piece in place, as torch's does, so views see it.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial

from meshshard.errors import LayoutError
from meshshard.shardtensor._aten import respec as _respec
from meshshard.shardtensor._aten.dispatch import (
    _PSUM,
    _REP,
    Plan,
    _coord,
    _execute,
    _key_of,
    same_layout,
)
from meshshard.shardtensor._aten.registry import POINTWISE, POINTWISE_INPLACE, register_rule
from meshshard.shardtensor._aten.tensor import SHARDED, ShardTensor, make_spec, shard_like

aten = torch.ops.aten


# ------------------------------------------------------------------ out of place
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


# ------------------------------------------------------------------ in place
_PLANS: dict = {}


def inplace_pointwise(func, args, kwargs):
    """The in-place rule: the pointwise plan, run, and ``self`` pointed at the result."""
    self = args[0]
    if type(self) is not ShardTensor:
        msg = (f"{func}: in place on a plain tensor with a ShardTensor operand; the result "
               "is sharded (use the out-of-place op)")
        raise LayoutError(msg)
    key = None
    if type(self._local) is torch.Tensor:  # eager: plans cached per layout, as dispatch does
        try:
            key = (func, _key_of(args), _key_of(tuple(kwargs.items())))
            plan = _PLANS.get(key)
        except TypeError:
            key = plan = None
    else:
        plan = None
    if plan is None:
        plan = _pointwise(func, args, kwargs)
        if key is not None:
            if len(_PLANS) > 4096:
                _PLANS.clear()
            _PLANS[key] = plan
    out = _execute(func, args, kwargs, plan)
    if out._local is not self._local or not same_layout(out._spec, self._spec):
        self._local = out._local
        self._spec = out._spec
        for name in [k for k in self.__dict__ if k.startswith("_sz")]:  # size carriers
            del self.__dict__[name]
    return self


register_rule(POINTWISE_INPLACE, direct=True)(inplace_pointwise)
