"""Linear algebra: ``mm``/``bmm``/``mv``/``dot`` and ``addmm`` by label algebra, and
``F.linear`` as one fused custom op.

Products: per mesh dim, a label sharded on some operand stays sharded in the output, or makes
it Partial when it is contracted; the other operands are narrowed to this rank's rows of that
label (no collective). A Partial factor is reduced first (one collective however the product
fans out). ``addmm`` reduces a Partial product before adding the bias once.

Fused linear, for eager speed. Through the generic rules a linear layer is 4-6 aten ops on the
wrapper (``t``, views, ``addmm``/``matmul``) plus a lift of the weight and the bias, each
~30 us of Python; forward and backward together ~10 wrapper dispatches per layer. Here it is
one op each way:

- forward ``meshshard::linear(x, w, b)``: the local ``F.linear``, output sharded like ``x``;
- backward ``meshshard::linear_backward``: ``dx`` locally, ``dW`` and ``db`` as local sums
  all-reduced once (one collective for both) over the mesh dims that shard ``x``'s rows, and
  returned as plain tensors: the weights' ``.grad`` is the global gradient.

Layouts the fast path does not cover (``x`` Partial, or sharded on its feature dim) run the
generic rules inside the same ops, so every layout stays exact. With ``create_graph=True`` the
backward is composed of differentiable wrapper ops instead, so second order flows through.
Weights that are themselves ShardTensors (tensor parallelism, :mod:`.tp`), and autocast
regions (autocast casts at the aten level), keep the generic path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate

from meshshard.shardtensor._aten import grad_bucket
from meshshard.shardtensor._aten.dispatch import (
    _PSUM,
    _REP,
    Plan,
    _all_reduce,
    _reduce_once,
    from_replicate_local,
    to_replicate_local,
)
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import (
    SHARDED,
    ShardTensor,
    make_spec,
    reduce_flattened,
    shard_like,
)

aten = torch.ops.aten


# ------------------------------------------------------------------ products
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


#: the two-operand products and their index labels (operands, output)
PRODUCTS: dict = {aten.mm.default: (("mk", "kn"), "mn"),
                  aten.bmm.default: (("bmk", "bkn"), "bmn"),
                  aten.mv.default: (("mk", "k"), "m"),
                  aten.dot.default: (("k", "k"), "")}


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


# ------------------------------------------------------------------ fused linear


@torch.library.custom_op("meshshard::linear", mutates_args=())
def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    msg = "meshshard::linear takes a ShardTensor input"
    raise TypeError(msg)


@_linear.register_fake
def _(x, w, b):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@torch.library.custom_op("meshshard::linear_backward", mutates_args=())
def _linear_bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    msg = "meshshard::linear_backward takes ShardTensors"
    raise TypeError(msg)


@_linear_bwd.register_fake
def _(g, x, w, bias):
    return torch.empty_like(x), torch.empty_like(w), w.new_empty(w.shape[0])


def _setup(ctx, inputs, output) -> None:
    x, w, b = inputs
    ctx.bias = b is not None
    ctx.ids = (id(w), id(b)) if b is not None else (id(w),)  # for a traced backward's bucket
    ctx.save_for_backward(x, w)


def _backward(ctx, g):
    x, w = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph: differentiable wrapper ops (w lifted)
        gx = torch.matmul(g, w)
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        gw = torch.mm(g2.t(), x2).full_tensor()
        gb = g2.sum(0).full_tensor() if ctx.bias else None
        return gx, gw, gb
    # the rule below hands dW and db to an open grad bucket (traced backward) if it takes both
    _CALL["ids"], _CALL["deferred"] = ctx.ids, False
    try:
        gx, gw, gb = torch.ops.meshshard.linear_backward(g, x, w, ctx.bias)
    finally:
        _CALL["ids"], deferred = None, _CALL["deferred"]
    if deferred:
        return gx, None, None
    return gx, gw, gb if ctx.bias else None


_CALL: dict = {"ids": None, "deferred": False}  # (one call at a time: set just above)


_linear.register_autograd(_backward, setup_context=_setup)


def _fast(spec, ndim: int) -> bool:
    """No Partial and the feature dim unsharded: the layer is row-local."""
    return not any(isinstance(p, Partial) or (isinstance(p, SHARDED) and p.dim == ndim - 1)
                   for p in spec.placements)


def _linear_rule(func, args, kwargs):
    x, w, b = args
    spec = x._spec
    if not _fast(spec, x.ndim):  # the generic rules of its parts (below autograd, composite
        # ops do not decompose by themselves)
        x2 = aten.reshape.default(x, [-1, x.shape[-1]])
        wt = aten.t.default(w)
        y2 = aten.mm.default(x2, wt) if b is None else aten.addmm.default(b, x2, wt)
        return aten.reshape.default(y2, [*x.shape[:-1], w.shape[0]])
    out = F.linear(x._local, w, b)
    return ShardTensor(out, make_spec(spec.mesh, spec.placements, spec.sizes,
                                          (*spec.shape[:-1], w.shape[0])))


def _grad_rows(g, spec):
    """``g``'s local piece in the rows of ``x`` (layout ``spec``), or None (generic path). A
    replicated gradient (that of ``y.sum()``) is cut to this rank's rows, no collective."""
    gs = g._spec
    if gs.placements == spec.placements and gs.sizes == spec.sizes:
        return g._local
    partial = [i for i, (p, q) in enumerate(zip(gs.placements, spec.placements))
               if isinstance(p, Partial) and isinstance(q, Replicate)]
    if partial and all(i in partial or (p == q and gs.sizes[i] == spec.sizes[i])
                       for i, (p, q) in enumerate(zip(gs.placements, spec.placements))):
        # a gradient still Partial where x is replicated (a head-shared linear after a
        # reduction over points): reduce it once, then the rows are x's
        loc = _reduce_once(g, partial[0], gs.mesh)
        for i in partial[1:]:
            loc = _all_reduce(loc, gs.mesh, i)
        return loc
    if all(isinstance(p, Replicate) for p in gs.placements):
        return from_replicate_local(g._local, make_spec(spec.mesh, spec.placements, spec.sizes,
                                                        tuple(gs.shape)))
    return None


def _linear_bwd_rule(func, args, kwargs):
    g, x, w, bias = args
    spec = x._spec
    fast = _fast(spec, x.ndim) and not any(isinstance(p, SHARDED) and p.dim == g.ndim - 1
                                           for p in g._spec.placements)
    gl = _grad_rows(g, spec) if fast else None  # (a Partial g is reduced there)
    if gl is None:
        g2 = aten.reshape.default(g, [-1, g.shape[-1]])
        x2 = aten.reshape.default(x, [-1, x.shape[-1]])
        gx = aten.reshape.default(aten.mm.default(g2, w), list(x.shape))
        gw = aten.mm.default(aten.t.default(g2), x2)
        gb = aten.sum.dim_IntList(g2, [0])
        return gx, to_replicate_local(gw._local, gw._spec), \
            to_replicate_local(gb._local, gb._spec)
    xl = x._local
    gx = gl.matmul(w)
    g2, x2 = gl.reshape(-1, gl.shape[-1]), xl.reshape(-1, xl.shape[-1])
    gw = g2.t().mm(x2)
    gb = g2.sum(0) if bias else gw.new_zeros(w.shape[0])
    reduce_dims = [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED)]
    ids = _CALL["ids"]
    if reduce_dims and ids is not None and all(map(grad_bucket.takes, ids)):
        key = (spec.mesh, gw.dtype, tuple(reduce_dims))
        for src, t in zip(ids, (gw, gb)):
            grad_bucket.defer(src, t, key)
        _CALL["deferred"] = True  # (gw, gb returned unsummed: the caller drops them)
    elif reduce_dims:  # one collective for both sums
        gw, gb = reduce_flattened([gw, gb], spec.mesh, reduce_dims)
    return ShardTensor(gx, spec), gw, gb


for _op, _fn in ((torch.ops.meshshard.linear.default, _linear_rule),
                 (torch.ops.meshshard.linear_backward.default, _linear_bwd_rule)):
    register_rule(_op, direct=True)(_fn)


def _autocast_on(device_type: str) -> bool:
    """Autocast enabled for ``device_type``; ``False`` for devices autocast does not know
    (``meta``, where ``torch.is_autocast_enabled`` raises)."""
    if not torch.amp.is_autocast_available(device_type):
        return False
    return torch.is_autocast_enabled(device_type)


def linear_function(input, weight, bias=None):
    """``F.linear`` on a ShardTensor input with plain weights: the fused op; anything else
    (weights that are ShardTensors, a plain input) keeps the generic path."""
    if type(input) is not ShardTensor or isinstance(weight, ShardTensor) or \
            isinstance(bias, ShardTensor) or _autocast_on(input.device.type):
        return NotImplemented  # (autocast casts at the aten level: the generic path keeps it)
    return torch.ops.meshshard.linear(input, weight, bias)


register_rule(F.linear)(linear_function)
