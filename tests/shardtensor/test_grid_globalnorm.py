"""The fused global-statistics norm's local kernels (row moments, row dots) against torch's
own group and instance norm in one process: forward and every gradient, float32 with a large
mean, float64, constant rows and empty shards."""

import pytest
import torch
import torch.nn.functional as F

from meshshard.shardtensor.handlers.grid._globalnorm import _dot, _moments, global_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["group", "instance"])
def test_global_norm_matches_torch_in_one_process(dtype, kind):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 8, 5, 6, 7, generator=g, dtype=dtype) * 3 + 20).requires_grad_()
    w = torch.randn(8, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(8, generator=g, dtype=dtype, requires_grad=True)
    if kind == "group":
        ref = F.group_norm(x, 4, w, b, 1e-5)
        xs, shape_w = x.reshape(2, 4, 2, 5, 6, 7), (1, 4, 2, 1, 1, 1)
        dims = (2, 3, 4, 5)
    else:
        ref = F.instance_norm(x, weight=w, bias=b, eps=1e-5)
        xs, shape_w = x, (1, 8, 1, 1, 1)
        dims = (2, 3, 4)
    n = 1
    for d in dims:
        n *= xs.shape[d]
    y, _, _ = global_norm(xs, dims, [], n, 1e-5, w.reshape(shape_w), b.reshape(shape_w))
    y = y.reshape(x.shape)
    grad = torch.randn(ref.shape, generator=g, dtype=dtype)
    want = torch.autograd.grad(ref, (x, w, b), grad)
    got = torch.autograd.grad(y, (x, w, b), grad)
    # float32: the mean of 20 costs digits in torch's own formula too
    tol = {"rtol": 3e-4, "atol": 3e-4} if dtype == torch.float32 else {}
    torch.testing.assert_close(y, ref, **tol)
    for name, a, e in zip(("x", "weight", "bias"), got, want):
        torch.testing.assert_close(a, e, **tol, msg=lambda m, k=name: f"{k}: {m}")


def test_moments_and_dot_edge_cases():
    z = torch.zeros(2, 3, 4, 5)
    v, m = _moments(z, (2, 3))
    assert v.shape == m.shape == (2, 3, 1, 1)
    assert (v == 0).all() and (m == 0).all()  # constant rows: variance exactly 0, not nan
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    v, m = _moments(x, (2, 3))
    v0, m0 = torch.var_mean(x, (2, 3), correction=0, keepdim=True)
    torch.testing.assert_close(v, v0)
    torch.testing.assert_close(m, m0)
    gr = torch.randn_like(x)
    torch.testing.assert_close(_dot(gr, x, (2, 3)), (gr * x).sum((2, 3), keepdim=True))
    empty = torch.zeros(0, 3, 4, 5)  # an empty batch shard
    v, m = _moments(empty, (2, 3))
    assert v.shape == (0, 3, 1, 1)
    assert _dot(empty, empty, (2, 3)).shape == (0, 3, 1, 1)
