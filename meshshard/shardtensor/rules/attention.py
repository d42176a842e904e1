"""``F.scaled_dot_product_attention`` on the aten-level ShardTensor: exact ring attention over
sharded tokens, forward and backward, eager and under ``torch.compile``.

Two levels of custom ops:

- ``meshshard::sdpa`` / ``meshshard::sdpa_backward`` take ShardTensors (global shapes). The
  wrapper's ``__torch_function__`` sends ``F.scaled_dot_product_attention`` on any ShardTensor
  here, so autograd records one node with the formula registered below, and dynamo records one
  graph node. Their sharding rules (below autograd) choose the mode from the layouts and call
- ``meshshard::ring_attention`` / ``meshshard::ring_attention_backward`` on the local pieces:
  the kernels of :mod:`.attention_ring` (key/value blocks round the ring with send/recv
  overlapped with compute, merged by log-sum-exp; backward sends the dK/dV partial sums behind
  the blocks). Under ``torch.compile`` these are opaque graph nodes with
  fake implementations, so the ring's point-to-point schedule runs as written.

Modes (per the layouts, as design A's rule): query and key/value tokens sharded on the same mesh
dim -> ``ring``; query tokens sharded, keys whole -> ``local`` (dK/dV come out Partial);
query whole, keys sharded -> ``merge``; batch/head dims sharded alike on other mesh dims ->
computed locally. ``attn_mask`` (boolean or additive): None, a plain or replicated tensor, a
ShardTensor sharded like the query (rows, batch or heads: same dim, same sizes), or sharded on
its last (key) dim, e.g. a key-padding mask laid out like the keys (see
:mod:`.attention_mask`). ``is_causal`` uses global token order. ``dropout_p > 0`` is refused.
Layouts that do not fit raise :class:`meshshard.errors.LayoutError` on every rank alike.
Second-order gradients through attention are not supported (as torch's flash kernels).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.comm.ring import Ring
from meshshard.errors import LayoutError
from meshshard.shardtensor._aten.attention_mask import mask_local
from meshshard.shardtensor._aten.attention_mha import mha_decomposed, mha_replicated
from meshshard.shardtensor._aten.attention_ring import AttnPlan, backward, forward
from meshshard.shardtensor._aten.dispatch import (
    _coord,
)
from meshshard.shardtensor._aten.layout import redistribute_local
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import (
    SHARDED,
    ShardTensor,
    _lift_plain,
    make_spec,
)

_NAME = "scaled_dot_product_attention"
_GROUPS: dict = {}  # group name -> process group, filled when a rule plans a ring


def _group(name: str):
    if not name:
        return None
    g = _GROUPS.get(name)
    if g is None:
        msg = f"{_NAME}: process group {name!r} is unknown in this process (plan it first)"
        raise RuntimeError(msg)
    return g


def _acc(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _plan(mask, mode, group, kv_sizes, q_offset, causal, scale, gqa, mask_col0):
    return AttnPlan(mode=mode, ring=Ring(_group(group)), kv_sizes=tuple(int(s) for s in kv_sizes),
                    q_offset=int(q_offset), mask=mask, causal=causal, scale=scale,
                    gqa_groups=gqa, mask_col0=int(mask_col0))


# ------------------------------------------------------------------ local kernels (opaque)
@torch.library.custom_op("meshshard::ring_attention", mutates_args=())
def _ring_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              mode: str, group: str, kv_sizes: list[int], q_offset: int, causal: bool,
              scale: float, gqa: int, mask_col0: int) -> tuple[torch.Tensor, torch.Tensor]:

    with torch.no_grad():
        out, lse = forward(q, k, v, _plan(mask, mode, group, kv_sizes, q_offset, causal,
                                          scale, gqa, mask_col0))
    return out.to(q.dtype), lse


@_ring_fwd.register_fake
def _(q, k, v, mask, mode, group, kv_sizes, q_offset, causal, scale, gqa, mask_col0):
    return (q.new_empty((*q.shape[:-1], v.shape[-1])),
            q.new_empty(q.shape[:-1], dtype=_acc(q.dtype)))


@torch.library.custom_op("meshshard::ring_attention_backward", mutates_args=())
def _ring_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, mask: torch.Tensor | None, mode: str,
              group: str, kv_sizes: list[int], q_offset: int, causal: bool, scale: float,
              gqa: int, mask_col0: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:

    with torch.no_grad():
        dq, dk, dv = backward(do.contiguous(), q, k, v, out, lse,
                              _plan(mask, mode, group, kv_sizes, q_offset, causal, scale, gqa,
                                    mask_col0))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@_ring_bwd.register_fake
def _(do, q, k, v, out, lse, mask, mode, group, kv_sizes, q_offset, causal, scale, gqa,
      mask_col0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# ------------------------------------------------------------------ wrapper-level ops
@torch.library.custom_op("meshshard::sdpa", mutates_args=())
def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          causal: bool, scale: float | None, gqa: bool) -> tuple[torch.Tensor, torch.Tensor]:
    msg = "meshshard::sdpa takes ShardTensors (F.scaled_dot_product_attention routes them)"
    raise TypeError(msg)


@_sdpa.register_fake
def _(q, k, v, mask, causal, scale, gqa):
    return (q.new_empty((*q.shape[:-1], v.shape[-1])),
            q.new_empty(q.shape[:-1], dtype=_acc(q.dtype)))


@torch.library.custom_op("meshshard::sdpa_backward", mutates_args=())
def _sdpa_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, mask: torch.Tensor | None, causal: bool,
              scale: float | None, gqa: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    msg = "meshshard::sdpa_backward takes ShardTensors"
    raise TypeError(msg)


@_sdpa_bwd.register_fake
def _(do, q, k, v, out, lse, mask, causal, scale, gqa):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output) -> None:
    q, k, v, mask, causal, scale, gqa = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1])
    ctx.args = (mask, causal, scale, gqa)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    mask, causal, scale, gqa = ctx.args
    if dout is None:
        return None, None, None, None, None, None, None
    dq, dk, dv = torch.ops.meshshard.sdpa_backward(dout, q, k, v, out, lse, mask, causal, scale,
                                                   gqa)
    return dq, dk, dv, None, None, None, None


_sdpa.register_autograd(_backward, setup_context=_setup)


def sdpa_function(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                  scale=None, enable_gqa=False):
    """What ``F.scaled_dot_product_attention`` on a ShardTensor runs (see the module doc)."""
    if dropout_p and dropout_p > 0:
        msg = (
            f"{_NAME}: dropout_p={dropout_p} on ShardTensors is not supported (the dropped "
            "entries would not match one process); pass dropout_p=0.0 (e.g. model.eval() or "
            "dropout=0.0 in the module)"
        )
        raise NotImplementedError(msg)
    if attn_mask is not None and attn_mask.requires_grad:
        msg = f"{_NAME}: gradients with respect to attn_mask are not supported on ShardTensors"
        raise NotImplementedError(msg)
    if torch.is_grad_enabled():  # plain q/k/v that need a gradient meet the wrappers lifted

        (query, key, value), _ = _lift_plain((query, key, value), {})
    out, _ = torch.ops.meshshard.sdpa(query, key, value, attn_mask, bool(is_causal),
                                      None if scale is None else float(scale), bool(enable_gqa))
    return out


# ------------------------------------------------------------------ rules
def _spec_of(t, mesh):
    if isinstance(t, ShardTensor):
        return t._spec
    return make_spec(mesh, (Replicate(),) * mesh.ndim, (None,) * mesh.ndim, tuple(t.shape))


def _reduced(t, mesh):
    """(local, spec) with Partial mesh dims summed (Replicate)."""
    spec = _spec_of(t, mesh)
    local = t._local if isinstance(t, ShardTensor) else t
    if any(isinstance(p, Partial) for p in spec.placements):
        pl = tuple(Replicate() if isinstance(p, Partial) else p for p in spec.placements)
        local = redistribute_local(local, spec, pl, spec.sizes)
        spec = make_spec(mesh, pl, spec.sizes, spec.shape)
    return local, spec


def _validate(query, key, value, attn_mask, causal, scale, gqa) -> None:
    """Checks that depend only on global shapes, so every rank raises alike."""
    if query.shape[-1] != key.shape[-1]:
        msg = (
            f"{_NAME}: head dims disagree: query {tuple(query.shape)} has E={query.shape[-1]}, "
            f"key {tuple(key.shape)} has E={key.shape[-1]}; they must be equal"
        )
        raise ValueError(msg)
    if key.shape[:-1] != value.shape[:-1]:
        msg = (
            f"{_NAME}: key {tuple(key.shape)} and value {tuple(value.shape)} must agree in every "
            "dim but the last (same batch, heads and number of keys)"
        )
        raise ValueError(msg)

    def meta(t):
        return None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")

    try:
        F.scaled_dot_product_attention(meta(query), meta(key), meta(value),
                                       attn_mask=meta(attn_mask), is_causal=causal,
                                       scale=scale, enable_gqa=gqa)
    except RuntimeError as exc:
        mshape = None if attn_mask is None else tuple(attn_mask.shape)
        msg = (
            f"{_NAME} fails on the global shapes query {tuple(query.shape)}, key "
            f"{tuple(key.shape)}, value {tuple(value.shape)}, attn_mask {mshape}: {exc}"
        )
        raise ValueError(msg) from exc


def _check_mesh_dim(i, qs, ks, vs, nd, gqa, ring_dim):
    """The mode this mesh dim implies ("ring", "local", "merge", or None: not a token dim);
    a layout that does not fit raises :class:`LayoutError`."""
    tok = nd - 2
    qp, kp, vp = qs.placements[i], ks.placements[i], vs.placements[i]
    if kp != vp or ks.sizes[i] != vs.sizes[i]:
        msg = (f"{_NAME}: key and value are laid out differently on mesh dim {i} ({kp}"
               f"{list(ks.sizes[i] or [])} vs {vp}{list(vs.sizes[i] or [])}); shard them "
               "alike, e.g. value = value.redistribute(key.placements, key.sharding_sizes())")
        raise LayoutError(msg)
    for p, nm in ((qp, "query"), (kp, "key")):
        if isinstance(p, SHARDED) and not isinstance(p, Shard):
            msg = f"{_NAME}: {nm} has a flattened layout {p}; reshape it back first"
            raise LayoutError(msg)
        if isinstance(p, Shard) and p.dim == nd - 1:
            msg = f"{_NAME}: {nm} is sharded on its feature dim {p.dim}; replicate that dim"
            raise LayoutError(msg)
    if gqa and isinstance(kp, Shard) and kp.dim == nd - 3:
        msg = f"{_NAME}: enable_gqa with the head dim sharded is not supported"
        raise LayoutError(msg)
    q_tok = isinstance(qp, Shard) and qp.dim == tok
    k_tok = isinstance(kp, Shard) and kp.dim == tok
    if not (q_tok or k_tok):
        if qp != kp or qs.sizes[i] != ks.sizes[i]:
            msg = (f"{_NAME}: keys are {kp}{list(ks.sizes[i] or [])} on mesh dim {i} but the "
                   f"query is {qp}{list(qs.sizes[i] or [])}; shard batch/head dims of query, "
                   "key and value alike")
            raise LayoutError(msg)
        return None
    if ring_dim is not None:
        msg = f"{_NAME}: tokens sharded on two mesh dims ({ring_dim} and {i})"
        raise LayoutError(msg)
    if k_tok and not (q_tok or isinstance(qp, Replicate)):
        msg = (f"{_NAME}: keys are sharded on their tokens on mesh dim {i}, the query as {qp}; "
               f"shard the query on its tokens (dim {tok}) or replicate it")
        raise LayoutError(msg)
    if q_tok and not (k_tok or isinstance(kp, Replicate)):
        msg = (f"{_NAME}: query tokens are sharded on mesh dim {i}, keys as {kp}; shard the "
               f"keys on their tokens (dim {tok}) or replicate them")
        raise LayoutError(msg)
    return "ring" if q_tok and k_tok else ("local" if q_tok else "merge")


def _layout(q, k, v, mask, causal, scale, gqa):
    """What both directions need: the mesh, the (Partial-reduced) specs of q, k, v, the mode
    and the local kernel's plan arguments. Checks depend only on global shapes and layouts, so
    every rank raises alike (before any collective)."""
    mesh = next(t._spec.mesh for t in (q, k, v, mask) if isinstance(t, ShardTensor))
    _validate(q, k, v, mask, causal, scale, gqa)
    nd = q.ndim
    if nd not in (3, 4):
        msg = f"{_NAME}: sharded attention takes 3-d or 4-d inputs, got {nd}-d"
        raise NotImplementedError(msg)
    tok = nd - 2
    qs, ks, vs = (_reduced_spec(t, mesh) for t in (q, k, v))
    ring_dim, mode = None, "local"
    for i in range(mesh.ndim):
        m = _check_mesh_dim(i, qs, ks, vs, nd, gqa, ring_dim)
        if m is not None:
            ring_dim, mode = i, m
    coord = _coord(mesh)[1]
    group, kv_sizes, q_off = "", (k.shape[tok],), 0
    if ring_dim is not None and mode != "local":
        g = mesh.get_group(ring_dim)
        group = g.group_name
        _GROUPS[group] = g
        kv_sizes = tuple(ks.sizes[ring_dim])
    if ring_dim is not None and mode != "merge":
        q_off = sum(qs.sizes[ring_dim][: coord[ring_dim]])
    ml, col0 = None, 0
    if mask is not None:
        ml, col0 = mask_local(mask, _spec_of(mask, mesh), qs, ks, ring_dim, mode, nd, q.dtype)
    groups = q.shape[-3] // k.shape[-3] if gqa and nd == 4 else 1
    sc = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    args = (ml, mode, group, list(kv_sizes), q_off, bool(causal), sc, groups, col0)
    return mesh, qs, ks, vs, ring_dim, mode, args


def _reduced_spec(t, mesh):
    spec = _spec_of(t, mesh)
    if any(isinstance(p, Partial) for p in spec.placements):
        pl = tuple(Replicate() if isinstance(p, Partial) else p for p in spec.placements)
        spec = make_spec(mesh, pl, spec.sizes, spec.shape)
    return spec


def _local4(t, mesh, nd):
    """The local piece with Partial dims summed, 4-d (a head dim of 1 for 3-d inputs)."""
    local = _reduced(t, mesh)[0]
    return local.unsqueeze(1) if nd == 3 else local


def _sdpa_rule(func, args, kwargs):
    q, k, v, mask, causal, scale, gqa = args
    mesh, qs, _, vs, _, _, largs = _layout(q, k, v, mask, causal, scale, gqa)
    nd = q.ndim
    ql, kl, vl = (_local4(t, mesh, nd) for t in (q, k, v))
    out, lse = torch.ops.meshshard.ring_attention(ql, *_bcast(ql, kl, vl, gqa), *largs)
    if nd == 3:
        out, lse = out.squeeze(1), lse.squeeze(1)
    ospec = make_spec(mesh, qs.placements, qs.sizes, (*qs.shape[:-1], vs.shape[-1]))
    lspec = make_spec(mesh, qs.placements, qs.sizes, tuple(qs.shape[:-1]))
    return ShardTensor(out, ospec), ShardTensor(lse, lspec)


def _bcast(ql, kl, vl, gqa: bool):
    """Keys/values of batch or head size 1 expanded to the query's (as torch broadcasts)."""
    heads = kl.shape[1] if gqa else ql.shape[1]
    if kl.shape[:2] != (ql.shape[0], heads):
        kl = kl.expand(ql.shape[0], heads, *kl.shape[2:])
        vl = vl.expand(ql.shape[0], heads, *vl.shape[2:])
    return kl, vl


def _sdpa_bwd_rule(func, args, kwargs):
    do, q, k, v, out, lse, mask, causal, scale, gqa = args
    mesh, qs, ks, vs, ring_dim, mode, largs = _layout(q, k, v, mask, causal, scale, gqa)
    nd = q.ndim
    ql, kl, vl, dol, outl = (_local4(t, mesh, nd) for t in (q, k, v, do, out))
    lsel = _reduced(lse, mesh)[0]
    if nd == 3:
        lsel = lsel.unsqueeze(1)
    kshape, vshape = kl.shape, vl.shape
    kb, vb = _bcast(ql, kl, vl, gqa)
    dq, dk, dv = torch.ops.meshshard.ring_attention_backward(dol, ql, kb, vb, outl, lsel,
                                                             *largs)
    dk, dv = _unbroadcast(dk, kshape), _unbroadcast(dv, vshape)
    if nd == 3:
        dq, dk, dv = dq.squeeze(1), dk.squeeze(1), dv.squeeze(1)
    kpl = list(ks.placements)
    if ring_dim is not None and mode == "local":  # each rank's queries saw all the keys
        kpl[ring_dim] = Partial()
    kspec = make_spec(mesh, tuple(kpl), ks.sizes, ks.shape)
    vspec = make_spec(mesh, tuple(kpl), vs.sizes, vs.shape)
    return ShardTensor(dq, qs), ShardTensor(dk, kspec), ShardTensor(dv, vspec)


def _unbroadcast(g: torch.Tensor, shape) -> torch.Tensor:
    """Sum a gradient over the batch/head dims a size-1 key/value was expanded along."""
    dims = [d for d in range(len(shape)) if shape[d] == 1 and g.shape[d] != 1]
    return g.sum(dims, keepdim=True) if dims else g


def mha_function(*args, **kwargs):
    """``F.multi_head_attention_forward`` (``nn.MultiheadAttention``) on ShardTensors: run as
    its parts, so its attention is the ring above (``need_weights=False`` required), or, when
    every ShardTensor argument is replicated, by torch on the local tensors (any options)."""

    sts = [a for a in (*args, *kwargs.values()) if isinstance(a, ShardTensor)]
    if all(isinstance(p, Replicate) for t in sts for p in t._spec.placements):
        return mha_replicated(sts[0]._spec.mesh, args, kwargs)
    return mha_decomposed(*args, **kwargs)


register_rule(torch.nn.functional.scaled_dot_product_attention)(sdpa_function)
register_rule(torch.nn.functional.multi_head_attention_forward)(mha_function)
register_rule(torch.ops.meshshard.sdpa.default, direct=True)(_sdpa_rule)
register_rule(torch.ops.meshshard.sdpa_backward.default, direct=True)(_sdpa_bwd_rule)
