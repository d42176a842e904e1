"""One key block of exact attention on local tensors, forward and backward, and the exact
log-sum-exp merge of block results: the kernels that :mod:`.attention_ring` runs for every block
in hand. No plan, no communication.

torch's CPU flash kernels are used where they apply (they return / take the log-sum-exp);
elsewhere (other devices, ``Ev != E``, private ops missing) plain torch math, tiled over query
rows so that a score tile holds at most ``_MATH_TILE`` elements.
"""

from __future__ import annotations

import torch

# torch's CPU flash kernels return / take the log-sum-exp (private ops: fall back to plain torch
# math, tiled over query rows, where they are missing, on other devices or when Ev != E)
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_MATH_TILE = 1 << 22  # score elements per tile of the plain-torch fallback


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _expand(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _fold(g: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return g
    b, h, n, e = g.shape
    return g.view(b, h // groups, groups, n, e).sum(2)


def _use_flash(q, v) -> bool:
    return (_FLASH is not None and _FLASH_BWD is not None and q.dtype in _FLASH_DTYPES
            and q.shape[-1] == v.shape[-1] and q.device.type == "cpu")


def _scores(q, k, m, causal, scale, acc, r0):
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
    if m is not None:
        s = s + (m if m.shape[-2] == 1 else m[..., r0 : r0 + q.shape[-2], :]).to(acc)
    if causal:
        i = torch.arange(r0, r0 + q.shape[-2], device=q.device)[:, None]
        j = torch.arange(k.shape[-2], device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    return s


def _row_tiles(q_len: int, per_row: int):
    step = max(1, _MATH_TILE // max(per_row, 1))
    return range(0, q_len, step), step


def _block_fwd(q, k, v, m, causal, scale):
    """(out, lse) of ``q`` over one key block, in the accumulation dtype."""
    acc = _acc_dtype(q.dtype)
    if _use_flash(q, v):
        mk = None if m is None else m.to(q.dtype)
        out, lse = _FLASH(q, k, v, 0.0, causal, attn_mask=mk, scale=scale)
        out, lse = out.to(acc), lse.to(acc)
    else:
        b, h, lq, _ = q.shape
        out = q.new_empty((b, h, lq, v.shape[-1]), dtype=acc)
        lse = q.new_empty((b, h, lq), dtype=acc)
        starts, step = _row_tiles(lq, b * h * k.shape[-2])
        for r0 in starts:
            s = _scores(q[..., r0 : r0 + step, :], k, m, causal, scale, acc, r0)
            t = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - torch.where(torch.isneginf(t), 0, t)[..., None])
            out[..., r0 : r0 + step, :] = torch.matmul(p, v.to(acc))
            lse[..., r0 : r0 + step] = t
    if m is not None:  # rows that see no key of this block: weight 0 in the merge
        dead = torch.isneginf(m).all(dim=-1).expand(lse.shape)
        lse = lse.masked_fill(dead, float("-inf"))
        out = out.masked_fill(dead[..., None], 0.0)
    return out, lse


def _block_bwd(do, q, k, v, out, lse, m, causal, scale):
    """This block's exact share (dq, dk, dv), given the global ``out`` and ``lse``."""
    if _use_flash(q, v):
        mk = None if m is None else m.to(q.dtype)
        return _FLASH_BWD(do, q, k, v, out, lse, 0.0, causal, attn_mask=mk, scale=scale)
    acc = _acc_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    ka, va = k.to(acc), v.to(acc)
    starts, step = _row_tiles(q.shape[-2], q.shape[0] * q.shape[1] * k.shape[-2])
    for r0 in starts:
        sl = slice(r0, r0 + step)
        qt, dot = q[..., sl, :].to(acc), do[..., sl, :].to(acc)
        s = _scores(qt, ka, m, causal, scale, acc, r0)
        p = torch.exp(s - lse[..., sl, None].to(acc))
        dv += torch.matmul(p.transpose(-1, -2), dot)
        dp = torch.matmul(dot, va.transpose(-1, -2))
        dd = (dot * out[..., sl, :].to(acc)).sum(-1, keepdim=True)
        ds = p * (dp - dd) * scale
        dq[..., sl, :] = torch.matmul(ds, ka)
        dk += torch.matmul(ds.transpose(-1, -2), qt)
    return dq, dk, dv


def _merge_(out, lse, o_b, lse_b) -> None:
    """In place: (out, lse) <- exact log-sum-exp merge of (out, lse) and (o_b, lse_b)."""
    new = torch.logaddexp(lse, lse_b)
    safe = torch.where(torch.isneginf(new), 0, new)
    out.mul_(torch.exp(lse - safe)[..., None]).add_(o_b.mul_(torch.exp(lse_b - safe)[..., None]))
    lse.copy_(new)
