"""One key block of exact attention on local tensors, forward and backward, and the exact
log-sum-exp merge of block results: the kernels that :mod:`.attention_ring` runs for every block
in hand. No plan, no communication.

Kernels, by device (each returns / takes the block's log-sum-exp, which the ring needs):

- CPU: torch's flash kernels (``_scaled_dot_product_flash_attention_for_cpu`` and its
  backward) where they apply;
- CUDA: the fused memory-efficient SDPA kernel (``_scaled_dot_product_efficient_attention``
  with ``compute_log_sumexp=True``, and its backward; what
  ``F.scaled_dot_product_attention`` dispatches to with a mask, fp16/bf16/fp32, any head
  dims). It is checked once per device and dtype against the plain-torch math on a small
  random block (forward and backward); if it raises or disagrees, the math is used and a
  warning says so (:func:`fused_kernel_report` tells which path each device took);
- elsewhere (other devices, fp64 on CUDA, ``Ev != E`` on the CPU, private ops missing) plain
  torch math, tiled over query rows so that a score tile holds at most ``_MATH_TILE`` elements.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# torch's CPU flash kernels return / take the log-sum-exp (private ops: fall back to plain torch
# math, tiled over query rows, where they are missing, on other devices or when Ev != E)
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_MATH_TILE = 1 << 22  # score elements per tile of the plain-torch fallback
_EFF = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None)
_EFF_BWD = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention_backward", None)
_EFF_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FUSED_OK: dict[tuple[str, torch.dtype], bool] = {}  # (device, dtype) -> self-check passed


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


def _use_fused_cuda(q) -> bool:
    """The CUDA fused kernel for ``q``'s dtype, once it passed its self-check there."""
    if q.device.type != "cuda" or _EFF is None or _EFF_BWD is None or \
            q.dtype not in _EFF_DTYPES:
        return False
    key = (str(q.device), q.dtype)
    if key not in _FUSED_OK:
        _FUSED_OK[key] = _self_check(q.device, q.dtype)
    return _FUSED_OK[key]


def fused_kernel_report() -> dict[str, bool]:
    """``{"cuda:0 torch.float16": True, ...}``: which (device, dtype) pairs ran the fused
    CUDA kernel (True) or fell back to the math after its self-check (False)."""
    return {f"{d} {t}": ok for (d, t), ok in _FUSED_OK.items()}


def _bias(m, b, h, lq, n, dtype):
    """The additive mask as the efficient kernel takes it: (B, H, Lq, n) with the last dim's
    stride a multiple of 16 (padded, then viewed back; SDPA does the same)."""
    if m is None:
        return None
    m = m.to(dtype)
    pad = (-n) % 16
    if pad:
        m = F.pad(m, (0, pad))[..., :n]
    return m.expand(b, h, lq, n)


def _lse_rows(lq: int) -> int:
    """Rows of the efficient kernel's log-sum-exp (rounded up to 32 on CUDA)."""
    return lq if torch.version.hip else math.ceil(lq / 32) * 32


def _fused_fwd(q, k, v, m, causal, scale):
    b, h, lq, _ = q.shape
    out, lse, _, _ = _EFF(q, k, v, _bias(m, b, h, lq, k.shape[-2], q.dtype), True, 0.0, causal,
                          scale=scale)
    return out, lse[..., :lq]


def _fused_bwd(do, q, k, v, out, lse, m, causal, scale):
    b, h, lq, _ = q.shape
    rows = _lse_rows(lq)
    lse = lse.to(torch.float32)
    if rows != lq:
        lse = F.pad(lse, (0, rows - lq))
    zero = torch.zeros((), dtype=torch.long, device=q.device)  # philox: no dropout
    bias = _bias(m, b, h, lq, k.shape[-2], q.dtype)
    dq, dk, dv, _ = _EFF_BWD(do.to(q.dtype), q, k, v, bias, out.to(q.dtype), lse.contiguous(),
                             zero, zero, 0.0, [True, True, True, False], causal, scale=scale)
    return dq, dk, dv


def _self_check(device, dtype) -> bool:
    """The fused kernel against the math on one small random block with a mask and a
    causal block (forward and backward), within the dtype's rounding."""
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        # 40 queries, 24 keys: the mask's padding and the causal corner (top left) are tested
        q, do = (torch.randn(1, 2, 40, 16, generator=g).to(device, dtype) for _ in range(2))
        k, v = (torch.randn(1, 2, 24, 16, generator=g).to(device, dtype) for _ in range(2))
        m = torch.randn(1, 1, 40, 24, generator=g).to(device, dtype)
        tol = {torch.float32: 2e-4}.get(dtype, 3e-2)
        for mask, causal in ((m, False), (None, True)):
            o1, l1 = _fused_fwd(q, k, v, mask, causal, 0.25)
            o2, l2 = _math_fwd(q, k, v, mask, causal, 0.25)
            g1 = _fused_bwd(do, q, k, v, o2.to(dtype), l2, mask, causal, 0.25)
            g2 = _math_bwd(do, q, k, v, o2, l2, mask, causal, 0.25)
            pairs = [(o1, o2), (l1, l2), *zip(g1, g2)]
            for a, b in pairs:
                a, b = a.double(), b.double()
                if not torch.allclose(a, b, rtol=tol, atol=tol * max(1.0, float(b.abs().max()))):
                    log.warning("attention: the fused CUDA kernel disagrees with the math on "
                                "%s %s (max diff %.3g); using the math", device, dtype,
                                float((a - b).abs().max()))
                    return False
        return True
    except Exception as exc:  # a kernel missing or refusing these shapes: the math serves
        log.warning("attention: the fused CUDA kernel failed on %s %s (%s); using the math",
                    device, dtype, exc)
        return False


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
    elif _use_fused_cuda(q):
        out, lse = _fused_fwd(q, k, v, m, causal, scale)
        out, lse = out.to(acc), lse.to(acc)
    else:
        out, lse = _math_fwd(q, k, v, m, causal, scale)
    if m is not None:  # rows that see no key of this block: weight 0 in the merge
        dead = torch.isneginf(m).all(dim=-1).expand(lse.shape)
        lse = lse.masked_fill(dead, float("-inf"))
        out = out.masked_fill(dead[..., None], 0.0)
    return out, lse


def _math_fwd(q, k, v, m, causal, scale):
    """Plain torch (out, lse) in the accumulation dtype, tiled over query rows."""
    acc = _acc_dtype(q.dtype)
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
    return out, lse


def _block_bwd(do, q, k, v, out, lse, m, causal, scale):
    """This block's exact share (dq, dk, dv), given the global ``out`` and ``lse``."""
    if _use_flash(q, v):
        mk = None if m is None else m.to(q.dtype)
        return _FLASH_BWD(do, q, k, v, out, lse, 0.0, causal, attn_mask=mk, scale=scale)
    if _use_fused_cuda(q):
        return _fused_bwd(do, q, k, v, out, lse, m, causal, scale)
    return _math_bwd(do, q, k, v, out, lse, m, causal, scale)


def _math_bwd(do, q, k, v, out, lse, m, causal, scale):
    """Plain torch (dq, dk, dv) in the accumulation dtype, tiled over query rows."""
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
