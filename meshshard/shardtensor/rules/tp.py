"""Rules for tensor parallelism and for products over tensors sharded on several dims.

Torch decomposes ``F.linear``, ``torch.matmul`` and ``torch.einsum`` above the dispatch into
views that flatten the batch-like dims into one (``(B, H, S, D) -> (B*H*S, D)``). When two of
those dims are sharded on different mesh dims (batch on ``"data"``, heads on ``"tensor"``,
points on ``"domain"``) the flattened dim would be sharded on two mesh dims at once, which the
layouts cannot express. Here such a product is instead one custom op, ``meshshard::einsum``,
computed on the local pieces by label algebra, per mesh dim:

- a label sharded on some operand (``Shard``) stays sharded in the output, or makes the output
  ``Partial`` when it is contracted; the other operands are narrowed to this rank's rows of
  that label (no collective); an operand sharded there on another label, or with other
  per-rank sizes, is gathered first;
- with no sharded label, one ``Partial`` operand makes the output ``Partial`` (the product is
  linear in it); further ``Partial`` operands are reduced.

Its autograd formula is two einsums of the same op, so gradients of any order flow, and the
weights' gradients come back in whatever layout the labels give (``Partial`` over the mesh
dims that shard the contracted rows); the weights' own ``from_local`` / lift turn them into
the weights' layout.

So a tensor-parallel linear needs nothing of its own: its weight piece, wrapped as a
ShardTensor ``Shard(0)`` (column-parallel) or ``Shard(1)`` (row-parallel) on the tensor mesh
dim, meets the activation in this op. Column-parallel gives the output sharded on the feature
dim; row-parallel contracts the sharded features and gives ``Partial``, reduced once by the
bias add or the next op that needs the value.

``F.linear`` here extends the fused linear rule of :mod:`.linalg` (``extends=``): the cases
above come here, every other goes on to that rule. The views these products need are in
:mod:`.view`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.shardtensor._aten.dispatch import _all_gather_v, _all_reduce, _coord, _narrow
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import (
    SHARDED,
    ShardTensor,
    _Lift,
    make_spec,
    replicate_spec,
)
from meshshard.shardtensor.rules import linalg as _fused

aten = torch.ops.aten
_REP, _PSUM = Replicate(), Partial()


# ------------------------------------------------------------------ the op
@torch.library.custom_op("meshshard::einsum", mutates_args=())
def _einsum(equation: str, operands: list[torch.Tensor]) -> torch.Tensor:
    msg = "meshshard::einsum takes ShardTensors"
    raise TypeError(msg)


@_einsum.register_fake
def _(equation, operands):
    return torch.einsum(equation, operands)


def _parse(eq: str) -> tuple[tuple[str, ...], str]:
    lhs, out = eq.replace(" ", "").split("->")
    return tuple(lhs.split(",")), out


def _setup(ctx, inputs, output) -> None:
    ctx.eq = inputs[0]
    ctx.save_for_backward(*inputs[1])


def _backward(ctx, g):
    (a_lab, b_lab), out = _parse(ctx.eq)
    a, b = ctx.saved_tensors
    ga = torch.ops.meshshard.einsum(f"{out},{b_lab}->{a_lab}", [g, b])
    gb = torch.ops.meshshard.einsum(f"{out},{a_lab}->{b_lab}", [g, a])
    return None, [ga, gb]


_einsum.register_autograd(_backward, setup_context=_setup)

_PLANS: dict = {}


def _plan(eq: str, specs: tuple) -> tuple:
    """(per operand: gather/reduce steps, narrow steps; output spec) for ``eq`` on ``specs``."""
    ins, out = _parse(eq)
    mesh = specs[0].mesh
    size = {L: s for lab, sp in zip(ins, specs) for L, s in zip(lab, sp.shape)}
    first = [[] for _ in ins]  # ("reduce", i) / ("gather", i, dim, sizes, blocks)
    narrow = [[] for _ in ins]  # (i, dim, sizes)
    placements, sizes, used = [], [], set()
    for i in range(mesh.ndim):
        chosen = None
        for lab, sp in zip(ins, specs):
            p = sp.placements[i]
            if type(p) is Shard and lab[p.dim] not in used:
                chosen = (lab[p.dim], tuple(sp.sizes[i]))
                break
        partial = [k for k, sp in enumerate(specs) if isinstance(sp.placements[i], Partial)]
        for k, (lab, sp) in enumerate(zip(ins, specs)):
            p = sp.placements[i]
            if isinstance(p, SHARDED):
                if chosen is not None and type(p) is Shard and lab[p.dim] == chosen[0] \
                        and tuple(sp.sizes[i]) == chosen[1]:
                    continue
                first[k].append(("gather", i, p.dim, sp.sizes[i], getattr(p, "blocks", 1)))
            if chosen is not None and chosen[0] in lab:
                narrow[k].append((i, lab.index(chosen[0]), chosen[1]))
        if chosen is not None:
            used.add(chosen[0])
            for k in partial:
                first[k].append(("reduce", i))
            L, s = chosen
            placements.append(Shard(out.index(L)) if L in out else _PSUM)
            sizes.append(s if L in out else None)
            continue
        for k in partial[1:]:  # linear in one Partial operand
            first[k].append(("reduce", i))
        placements.append(_PSUM if partial else _REP)
        sizes.append(None)
    spec = make_spec(mesh, tuple(placements), tuple(sizes), tuple(size[L] for L in out))
    return tuple(zip(first, narrow)), spec


def _einsum_rule(func, args, kwargs):
    eq, ops = args
    specs = tuple(o._spec for o in ops)
    tracing = any(type(o._local) is not torch.Tensor for o in ops)
    key = None if tracing else (eq, specs)
    plan = None if key is None else _PLANS.get(key)
    if plan is None:
        plan = _plan(eq, specs)
        if key is not None:
            if len(_PLANS) > 4096:
                _PLANS.clear()
            _PLANS[key] = plan
    steps, out = plan
    mesh = out.mesh
    coord = _coord(mesh)[1]
    locs = []
    for o, (first, narrow) in zip(ops, steps):
        loc = o._local
        for st in first:  # every gather and reduce before any narrowing
            if st[0] == "reduce":
                loc = _all_reduce(loc, mesh, st[1])
            else:
                _, i, d, s, blocks = st
                loc = _all_gather_v(loc, d, s, mesh, i, blocks)
        for i, d, s in narrow:
            loc = _narrow(loc, d, s, coord[i])
        locs.append(loc)
    return ShardTensor(torch.einsum(eq, locs), out)


register_rule(torch.ops.meshshard.einsum.default, direct=True)(_einsum_rule)


# ------------------------------------------------------------------ when torch calls route here
def _wrap(ops: list) -> list | None:
    """All operands as ShardTensors on one mesh (plain ones Replicate: lifted when they need a
    gradient), or None when there is no single mesh."""
    meshes = {id(o._spec.mesh): o._spec.mesh for o in ops if type(o) is ShardTensor}
    if len(meshes) != 1:
        return None
    (mesh,) = meshes.values()
    out = []
    for o in ops:
        if type(o) is ShardTensor:
            out.append(o)
        elif not isinstance(o, torch.Tensor):
            return None
        elif o.requires_grad and torch.is_grad_enabled():
            out.append(_Lift.apply(o, mesh))
        else:
            out.append(ShardTensor(o, replicate_spec(mesh, o.shape)))
    return out


def _ok(eq: str, ndims: list) -> bool:
    """Two operands, explicit output, no ellipsis or repeated label, and every label of each
    operand in the output or the other operand (so each gradient is one einsum)."""
    if "->" not in eq or "." in eq:
        return False
    ins, out = _parse(eq)
    if len(ins) != 2 or [len(s) for s in ins] != ndims:
        return False
    if any(len(set(s)) != len(s) for s in (*ins, out)) or not set(out) <= set(ins[0] + ins[1]):
        return False
    a, b = ins
    return all(L in out or L in b for L in a) and all(L in out or L in a for L in b)


def _multi_sharded(ops: list, ins: tuple) -> bool:
    """Two or more labels sharded (on any mesh dims): the decomposed product would flatten
    them into one dim. Products with one sharded label keep the generic rules."""
    labels = set()
    for o, lab in zip(ops, ins):
        if type(o) is ShardTensor:
            for p in o._spec.placements:
                if isinstance(p, SHARDED):
                    labels.add(lab[p.dim])
    return len(labels) >= 2


def _route(eq: str, ops: list, force: bool = False):
    if not _ok(eq, [o.ndim for o in ops]):
        return NotImplemented
    if not force and not _multi_sharded(ops, _parse(eq)[0]):
        return NotImplemented
    wrapped = _wrap(ops)
    if wrapped is None:
        return NotImplemented
    return torch.ops.meshshard.einsum(eq, wrapped)


_LETTERS = "abcdefghijklmnopqrstuvw"


def einsum_function(equation, *operands):
    ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) \
        else list(operands)
    if not isinstance(equation, str) or len(ops) != 2:
        return NotImplemented
    return _route(equation, ops)


def matmul_function(a, b):
    """``a @ b`` with equal batch shapes (no broadcasting) and both at least 2-d."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.ndim < 2 \
            or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a.ndim > 20:
        return NotImplemented
    batch = _LETTERS[: a.ndim - 2]
    return _route(f"{batch}xy,{batch}yz->{batch}xz", [a, b])


_prev_linear = _fused.linear_function


def linear_function(input, weight, bias=None):
    """``F.linear`` with a ShardTensor weight (tensor parallelism), or on an input the fused
    rule does not take whose leading dims are sharded on two or more mesh dims: the einsum
    op (no flattening view), then the bias as an ordinary add (a Partial product is reduced
    there, once). Anything else: the fused rule."""
    tp = isinstance(weight, ShardTensor) or isinstance(bias, ShardTensor)
    if isinstance(input, torch.Tensor) and isinstance(weight, torch.Tensor) and weight.ndim == 2 \
            and 1 <= input.ndim <= 20 and (tp or (type(input) is ShardTensor and not _fused._fast(
                input._spec, input.ndim))):
        batch = _LETTERS[: input.ndim - 1]
        out = _route(f"{batch}y,zy->{batch}z", [input, weight], force=tp)
        if out is not NotImplemented:
            return out if bias is None else out + bias
    return _prev_linear(input, weight, bias)


register_rule(torch.einsum)(einsum_function)
register_rule(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)(matmul_function)
register_rule(F.linear, extends=_prev_linear)(linear_function)  # the fused rule's, extended
