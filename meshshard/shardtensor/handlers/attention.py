"""``F.scaled_dot_product_attention`` on ShardTensors: exact ring attention over sharded tokens.

Layouts (``nd``-d inputs, tokens on dim ``nd - 2``, one mesh dim carrying the tokens):

- query and key/value tokens sharded on the same mesh dim (sizes may differ, zeros allowed, and
  the query and key lengths may differ: cross-attention) -> ring attention
  (:mod:`meshshard.shardtensor.ring_attention`), output sharded like the query;
- query tokens sharded, keys/values replicated -> each rank attends locally, no ring;
- query replicated, key/value tokens sharded -> each rank attends to its keys, results merged by
  log-sum-exp, output replicated;
- batch/head dims sharded alike on other mesh dims -> computed locally.

``attn_mask`` (boolean or additive) may be a plain tensor, a replicated ShardTensor, a
ShardTensor sharded like the query rows (dim -2, the query's sizes), or, with a query dim of
1 (a key-padding mask), sharded on its key dim (gathered: it is one row per batch).
``is_causal`` uses global token order (torch's top-left convention); blocks that are wholly in
the future are skipped. ``enable_gqa`` is supported. ``dropout_p > 0`` is refused.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard

from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._generic import replicated_apply
from meshshard.shardtensor._layout import LayoutError, check_same_mesh, reduce_partials, wrap
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import register_handler
from meshshard.shardtensor.ring import Ring
from meshshard.shardtensor.ring_attention import AttnPlan, attention
from meshshard.shardtensor.spec import ShardSpec

_NAME = "scaled_dot_product_attention"


def _placement(t, i: int):
    return t._spec.placements[i] if isinstance(t, ShardTensor) else Replicate()


def _sizes(t, i: int):
    return t._spec.sizes[i] if isinstance(t, ShardTensor) else None


def _validate(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> None:
    """Checks that depend only on global shapes and layouts, so every rank raises alike."""
    if dropout_p and dropout_p > 0:
        msg = (
            f"{_NAME}: dropout_p={dropout_p} on ShardTensors is not supported (the dropped "
            "entries would not match one process); pass dropout_p=0.0 (e.g. model.eval() or "
            "dropout=0.0 in the module)"
        )
        raise NotImplementedError(msg)
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
                                       attn_mask=meta(attn_mask), is_causal=is_causal,
                                       scale=scale, enable_gqa=enable_gqa)
    except RuntimeError as exc:
        mshape = None if attn_mask is None else tuple(attn_mask.shape)
        msg = (
            f"{_NAME} fails on the global shapes query {tuple(query.shape)}, key "
            f"{tuple(key.shape)}, value {tuple(value.shape)}, attn_mask {mshape}: {exc}"
        )
        raise ValueError(msg) from exc


def _kv_local(t, out_spec: ShardSpec, token_dim: int, ring_dim: int | None):
    """Local piece of key or value: already-sharded mesh dims are kept, replicated ones meeting a
    sharded output are cut (batch dims) or used whole (the token dim; gradient summed)."""
    local = t._local if isinstance(t, ShardTensor) else t
    groups = []
    for i, op in enumerate(out_spec.placements):
        kp = _placement(t, i)
        if i == ring_dim or not isinstance(kp, Replicate) or isinstance(op, Replicate):
            continue
        d = op.dim
        group = out_spec.mesh.get_group(i)
        if d != token_dim and local.shape[d] == out_spec.shape[d] and local.shape[d] != 1:
            local = C.split_local(local, d, out_spec.sizes[i], group)
        else:
            groups.append(group)
    return C.grad_all_reduce(local, groups) if groups else local


def _mask_local(mask, q, k, mode: str, ring_dim: int | None, nd: int, dtype) -> torch.Tensor:
    """This rank's rows of the mask, every key column in global order, additive, 4-d."""
    mnd = mask.ndim
    rows_d, cols_d = mnd - 2, mnd - 1
    local = mask._local if isinstance(mask, ShardTensor) else mask
    if local.requires_grad:
        msg = f"{_NAME}: gradients with respect to attn_mask are not supported on ShardTensors"
        raise NotImplementedError(msg)
    qspec = q._spec if isinstance(q, ShardTensor) else None
    mesh = (qspec or k._spec).mesh
    for i in range(mesh.ndim):
        mp, qp = _placement(mask, i), _placement(q, i)
        group = mesh.get_group(i)
        if isinstance(mp, Shard) and mp.dim == cols_d and i == ring_dim:
            if mask.shape[rows_d] != 1 and mode != "merge" and isinstance(qp, Shard):
                msg = (
                    f"{_NAME}: an attn_mask sharded on its key dim must have a query dim of 1 "
                    f"(a key-padding mask), got {tuple(mask.shape)}; shard it like the query "
                    "rows (dim -2) or replicate it"
                )
                raise LayoutError(msg)
            local = C.all_gather_v(local, cols_d, mask._spec.sizes[i], group)
            mp = Replicate()
        q_d = qp.dim - (nd - mnd) if isinstance(qp, Shard) else None
        if isinstance(mp, Shard):
            if isinstance(qp, Shard) and mp.dim == q_d and mask._spec.sizes[i] == qspec.sizes[i]:
                continue  # sharded exactly like the query
            msg = (
                f"{_NAME}: attn_mask layout {mask._spec.describe()} does not match the query's "
                f"{qspec.describe() if qspec else 'replicated layout'} on mesh dim {i}: shard "
                "it like the query rows (same dim, same sizes), shard a key-padding mask on its "
                "key dim like the keys, or replicate it"
            )
            raise LayoutError(msg)
        if isinstance(qp, Shard) and q_d is not None and q_d >= 0 and local.shape[q_d] != 1:
            off = qspec.offset(qp.dim)
            local = local.narrow(q_d, off, qspec.local_shape()[qp.dim])
    if local.dtype == torch.bool:
        local = torch.zeros(local.shape, dtype=dtype, device=local.device).masked_fill(
            ~local, float("-inf"))
    else:
        local = local.to(dtype)
    want = 4 if nd == 4 else 3
    while local.ndim < want:
        local = local.unsqueeze(0)
    return local.unsqueeze(1) if nd == 3 else local


@register_handler(F.scaled_dot_product_attention)
def sdpa_rule(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
    """Sharding rule for ``F.scaled_dot_product_attention`` (see the module docstring).

    Collective: every rank of the mesh must call it (forward and backward) when tokens are
    sharded.
    """
    sts = [t for t in (query, key, value, attn_mask) if isinstance(t, ShardTensor)]
    mesh = check_same_mesh(sts)
    query, key, value, attn_mask = (reduce_partials(t) if isinstance(t, ShardTensor) else t
                                    for t in (query, key, value, attn_mask))
    _validate(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    kw = {"dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
    if enable_gqa:
        kw["enable_gqa"] = True
    if all(t._spec.is_replicated() for t in sts):
        return replicated_apply(F.scaled_dot_product_attention, (query, key, value),
                                {"attn_mask": attn_mask, **kw})
    nd = query.ndim
    tok = nd - 2
    ring_dim, mode = None, "local"
    for i in range(mesh.ndim):
        qp, kp, vp = _placement(query, i), _placement(key, i), _placement(value, i)
        if kp != vp or _sizes(key, i) != _sizes(value, i):
            msg = (
                f"{_NAME}: key and value are laid out differently on mesh dim {i} ({kp}"
                f"{list(_sizes(key, i) or [])} vs {vp}{list(_sizes(value, i) or [])}); shard "
                "them alike, e.g. value = value.redistribute(key.placements, "
                "key.sharding_sizes())"
            )
            raise LayoutError(msg)
        for t, nm in ((query, "query"), (key, "key")):
            p = _placement(t, i)
            if isinstance(p, Shard) and p.dim == nd - 1:
                msg = f"{_NAME}: {nm} is sharded on its feature dim {p.dim}; replicate that dim"
                raise LayoutError(msg)
        q_tok = isinstance(qp, Shard) and qp.dim == tok
        k_tok = isinstance(kp, Shard) and kp.dim == tok
        if q_tok or k_tok:
            if ring_dim is not None:
                msg = f"{_NAME}: tokens sharded on two mesh dims ({ring_dim} and {i})"
                raise LayoutError(msg)
            if k_tok and not (q_tok or isinstance(qp, Replicate)):
                msg = (
                    f"{_NAME}: keys are sharded on their tokens on mesh dim {i}, the query as "
                    f"{qp}; shard the query on its tokens (dim {tok}) or replicate it"
                )
                raise LayoutError(msg)
            if q_tok and not (k_tok or isinstance(kp, Replicate)):
                msg = (
                    f"{_NAME}: query tokens are sharded on mesh dim {i}, keys as {kp}; shard "
                    f"the keys on their tokens (dim {tok}) or replicate them"
                )
                raise LayoutError(msg)
            ring_dim = i
            mode = "ring" if q_tok and k_tok else ("local" if q_tok else "merge")
        elif isinstance(kp, Shard) and (qp != kp or _sizes(query, i) != _sizes(key, i)):
            msg = (
                f"{_NAME}: keys are sharded on dim {kp.dim} on mesh dim {i} but the query is "
                f"{qp}{list(_sizes(query, i) or [])}; shard batch/head dims alike"
            )
            raise LayoutError(msg)
        if enable_gqa and isinstance(kp, Shard) and kp.dim == nd - 3:
            msg = f"{_NAME}: enable_gqa with the head dim sharded is not supported"
            raise LayoutError(msg)
    if nd not in (3, 4):
        msg = f"{_NAME}: sharded attention takes 3-d or 4-d inputs, got {nd}-d"
        raise NotImplementedError(msg)
    # output layout
    if isinstance(query, ShardTensor):
        qspec = query._spec
    else:
        qspec = ShardSpec(mesh, (Replicate(),) * mesh.ndim, (None,) * mesh.ndim, query.shape)
    oshape = torch.Size((*qspec.shape[:-1], value.shape[-1]))
    placements, sizes = list(qspec.placements), list(qspec.sizes)
    for i in range(mesh.ndim):  # batch dims sharded on K/V but query replicated: refused above
        if isinstance(_placement(key, i), Shard) and i != ring_dim:
            placements[i], sizes[i] = _placement(key, i), _sizes(key, i)
    out_spec = ShardSpec(mesh, tuple(placements), tuple(sizes), oshape)
    ql = query._local if isinstance(query, ShardTensor) else query
    kl = _kv_local(key, out_spec, tok, ring_dim if mode != "local" else None)
    vl = _kv_local(value, out_spec, tok, ring_dim if mode != "local" else None)
    dtype = ql.dtype
    ml = None
    if attn_mask is not None:
        ml = _mask_local(attn_mask, query, key, mode, ring_dim, nd, dtype)
    if nd == 3:
        ql, kl, vl = ql.unsqueeze(1), kl.unsqueeze(1), vl.unsqueeze(1)
    groups = ql.shape[1] // kl.shape[1] if enable_gqa else 1
    heads = kl.shape[1] if enable_gqa else ql.shape[1]
    if kl.shape[:2] != (ql.shape[0], heads):  # broadcast batch / heads of size 1
        kl = kl.expand(ql.shape[0], heads, *kl.shape[2:])
        vl = vl.expand(ql.shape[0], heads, *vl.shape[2:])
    group = None if ring_dim is None or mode == "local" else mesh.get_group(ring_dim)
    kv_sizes = (kl.shape[-2],) if mode == "local" else tuple(key._spec.sizes[ring_dim])
    q_off = qspec.offset(tok) if ring_dim is not None and mode != "merge" else 0
    plan = AttnPlan(
        mode=mode,
        ring=Ring(group),
        kv_sizes=kv_sizes,
        q_offset=q_off,
        mask=ml,
        causal=bool(is_causal),
        scale=float(scale) if scale is not None else 1.0 / math.sqrt(ql.shape[-1]),
        gqa_groups=groups,
    )
    out = attention(ql, kl, vl, plan)
    if nd == 3:
        out = out.squeeze(1)
    return wrap(out, out_spec)
