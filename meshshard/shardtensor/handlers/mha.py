"""``F.multi_head_attention_forward`` (what ``nn.MultiheadAttention`` calls) on ShardTensors.

The rule decomposes the function into its parts, each of which has a sharding rule: input
projections (``F.linear`` with replicated weights), a reshape to ``(B, H, L, E)``,
``F.scaled_dot_product_attention`` (ring attention when tokens are sharded, see
:mod:`.attention`), and the output projection. Inputs are sequence-first ``(L, B, E)``, as the
module passes them (``batch_first=True`` modules transpose before the call).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshshard.shardtensor._generic import replicated_apply
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import register_handler

_NAME = "multi_head_attention_forward"


def _additive(mask, dtype):
    """MultiheadAttention's convention: a boolean True means *masked out*."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill(mask, float("-inf"))


@register_handler(F.multi_head_attention_forward)
def mha_rule(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
             bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias,
             training=True, key_padding_mask=None, need_weights=True, attn_mask=None,
             use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
             v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True,
             is_causal=False):
    """Sharding rule for ``F.multi_head_attention_forward`` (returns ``(out, None)``).

    Collective when tokens are sharded (see :func:`.attention.sdpa_rule`).
    """
    args = (query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
            bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias)
    kwargs = {"training": training, "key_padding_mask": key_padding_mask,
              "need_weights": need_weights, "attn_mask": attn_mask,
              "use_separate_proj_weight": use_separate_proj_weight,
              "q_proj_weight": q_proj_weight, "k_proj_weight": k_proj_weight,
              "v_proj_weight": v_proj_weight, "static_k": static_k, "static_v": static_v,
              "average_attn_weights": average_attn_weights, "is_causal": is_causal}
    sts = [t for t in (*args, *kwargs.values()) if isinstance(t, ShardTensor)]
    if all(t._spec.is_replicated() for t in sts):
        return replicated_apply(F.multi_head_attention_forward, args, kwargs)
    return mha_decomposed(*args, **kwargs)


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
