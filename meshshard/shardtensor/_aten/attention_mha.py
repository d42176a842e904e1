"""``F.multi_head_attention_forward`` (what ``nn.MultiheadAttention`` calls) on ShardTensors.

The rule runs the function as its parts, each of which has a sharding rule: input projections
(``F.linear`` with replicated weights), a reshape to ``(B, H, L, E)``,
``F.scaled_dot_product_attention`` (ring attention when tokens are sharded, see
:mod:`meshshard.shardtensor.rules.attention`), and the output projection. Inputs are
sequence-first ``(L, B, E)``, as the module passes them (``batch_first=True`` modules
transpose before the call). A ``key_padding_mask`` sharded on its key dim like the keys stays
so (the attention rule takes it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshshard.shardtensor._aten.layout import from_local
from meshshard.shardtensor._aten.tensor import ShardTensor

__all__ = ["mha_decomposed", "mha_replicated"]

_NAME = "multi_head_attention_forward"


def _additive(mask, dtype):
    """MultiheadAttention's convention: a boolean True means *masked out*."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill(mask, float("-inf"))


def mha_replicated(mesh, args: tuple, kwargs: dict) -> tuple:
    """Every ShardTensor argument replicated: torch's own function on the local tensors
    (differentiable through ``to_local``/``from_local``), outputs replicated. No collective."""
    from torch.distributed.tensor import Replicate


    def local(a):
        return a.to_local() if isinstance(a, ShardTensor) else a

    out, weights = F.multi_head_attention_forward(
        *(local(a) for a in args), **{k: local(v) for k, v in kwargs.items()})
    rep = [Replicate()] * mesh.ndim

    def wrap(t):
        return None if t is None else from_local(t, mesh, rep, validate=False)

    return wrap(out), wrap(weights)


def mha_decomposed(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                   in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight,
                   out_proj_bias, training=True, key_padding_mask=None, need_weights=True,
                   attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None,
                   k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
                   average_attn_weights=True, is_causal=False):
    """``F.multi_head_attention_forward`` as the torch functions it is made of (``F.linear``,
    views, ``F.scaled_dot_product_attention``), each of which has a sharding rule: the
    ShardTensor rule of every ShardTensor class. Returns ``(out, None)``."""
    if need_weights:
        msg = (
            f"{_NAME}: need_weights=True on token-sharded ShardTensors would build the whole "
            "(L, S) attention matrix; call the module with need_weights=False"
        )
        raise NotImplementedError(msg)
    if bias_k is not None or bias_v is not None or add_zero_attn or static_k is not None \
            or static_v is not None:
        msg = (f"{_NAME}: add_bias_kv, add_zero_attn and static_k/v are not supported on "
               "ShardTensors")
        raise NotImplementedError(msg)
    if query.ndim != 3:
        msg = f"{_NAME}: unbatched input is not supported on ShardTensors; add a batch dim"
        raise NotImplementedError(msg)
    L, B, E = query.shape
    S = key.shape[0]
    if E != embed_dim_to_check or E % num_heads:
        msg = f"{_NAME}: embed dim {E} must be {embed_dim_to_check} and divisible by {num_heads}"
        raise ValueError(msg)
    hd = E // num_heads
    if use_separate_proj_weight:
        ws = (q_proj_weight, k_proj_weight, v_proj_weight)
    else:
        ws = in_proj_weight.chunk(3)
    bs = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3)

    def heads(x, w, b, n):  # (n, B, E) -> (B, H, n, hd)
        return F.linear(x, w, b).reshape(n, B, num_heads, hd).permute(1, 2, 0, 3)

    q = heads(query, ws[0], bs[0], L)
    k = heads(key, ws[1], bs[1], S)
    v = heads(value, ws[2], bs[2], S)
    mask = _additive(attn_mask, query.dtype)
    if mask is not None:
        mask = mask.reshape(1, 1, L, S) if mask.ndim == 2 else mask.reshape(B, num_heads, L, S)
    kpm = _additive(key_padding_mask, query.dtype)
    causal = False
    if is_causal and kpm is None:
        mask, causal = None, True  # as torch does: the mask is only a hint
    if kpm is not None:
        kpm = kpm.reshape(B, 1, 1, S)
        mask = kpm if mask is None else mask + kpm
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                       dropout_p=dropout_p if training else 0.0,
                                       is_causal=causal)
    o = o.permute(2, 0, 1, 3).reshape(L, B, E)
    return F.linear(o, out_proj_weight, out_proj_bias), None
