"""The block kernels ring attention runs, by device: the CPU keeps torch's CPU flash kernel (or
the math), CUDA takes the fused memory-efficient SDPA kernel with its log-sum-exp, after a
self-check against the math. Without a GPU the CUDA calls are checked on the meta device (their
registered shapes: the argument lists and the log-sum-exp's padding are right); with one (the
``gpu`` marker) against the math, forward and backward."""

from __future__ import annotations

import pytest
import torch

from meshshard.shardtensor._aten import attention_block as B
from meshshard.shardtensor._aten import attention_ring as R


def test_cpu_never_takes_the_cuda_kernel():
    q = torch.randn(1, 2, 5, 8)
    assert not B._use_fused_cuda(q)
    assert B._use_flash(q, q)
    assert R._block_rows(R.KV_CHUNK_ROWS, q.device) == R.KV_CHUNK_ROWS


def test_gpu_blocks_are_larger():
    assert R._block_rows(1024, torch.device("cuda", 0)) == 1024 * R.GPU_BLOCK_SCALE > 1024


@pytest.mark.parametrize("lq", [40, 64, 1])
def test_fused_calls_are_well_formed_on_meta(lq):
    meta = {"device": "meta", "dtype": torch.float16}
    q = torch.empty(2, 3, lq, 16, **meta)
    k = torch.empty(2, 3, 24, 16, **meta)
    v = torch.empty(2, 3, 24, 8, **meta)  # Ev != E
    m = torch.empty(1, 1, lq, 24, device="meta")
    out, lse = B._fused_fwd(q, k, v, m, False, 0.3)
    assert out.shape == (2, 3, lq, 8) and lse.shape == (2, 3, lq)
    do = torch.empty(2, 3, lq, 8, device="meta")
    dq, dk, dv = B._fused_bwd(do, q, k, v, out.float(), lse, None, True, 0.3)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert B._bias(m, 2, 3, lq, 24, torch.float16).stride(-2) % 16 == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fused_cuda_kernel_equals_math(dtype):
    dev = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(0)
    q, do = (torch.randn(1, 2, 70, 32, generator=g).to(dev, dtype) for _ in range(2))
    k, v = (torch.randn(1, 2, 50, 32, generator=g).to(dev, dtype) for _ in range(2))
    m = torch.randn(1, 1, 70, 50, generator=g).to(dev, dtype)
    assert B._use_fused_cuda(q), B.fused_kernel_report()
    tol = 2e-4 if dtype == torch.float32 else 3e-2
    for mask, causal in ((m, False), (None, True), (None, False)):
        o1, l1 = B._block_fwd(q, k, v, mask, causal, 0.2)
        o2, l2 = B._math_fwd(q, k, v, mask, causal, 0.2)
        torch.testing.assert_close(o1, o2.to(o1.dtype), rtol=tol, atol=tol)
        torch.testing.assert_close(l1, l2.to(l1.dtype), rtol=tol, atol=tol)
        g1 = B._block_bwd(do, q, k, v, o2.to(dtype), l2, mask, causal, 0.2)
        g2 = B._math_bwd(do, q, k, v, o2, l2, mask, causal, 0.2)
        for a, b in zip(g1, g2):
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * 10)
