"""The grid conv rule's oneDNN convolution: forward and every gradient equal torch's own conv,
including the backward cut into a batch of two halves (strides, dilation, gaps between
windows, odd output counts), and that backward does not allocate the native kernel's column
buffer."""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from meshshard.shardtensor.handlers.grid._onednn import OneDnnConv, _halves, uses_onednn

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="needs torch built with oneDNN")

CASES = [
    # shape, kernel, stride, dilation, padding
    ((1, 8, 9, 20, 20), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1)),
    ((1, 8, 10, 20, 20), (3, 3, 3), (2, 1, 1), (1, 1, 1), (0, 1, 1)),
    ((1, 4, 11, 20, 20), (3, 3, 3), (1, 1, 1), (2, 1, 1), (0, 1, 1)),
    ((1, 4, 12, 20, 20), (2, 3, 3), (2, 2, 2), (1, 1, 1), (0, 1, 1)),
    ((1, 4, 14, 20, 20), (2, 3, 3), (3, 1, 1), (1, 1, 1), (0, 0, 0)),  # rows between windows
    ((1, 4, 13, 20, 20), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0)),
    ((1, 3, 9, 10), (3, 3), (1, 1), (1, 1), (0, 1)),
]


@pytest.mark.parametrize(("shape", "k", "stride", "dilation", "padding"), CASES)
def test_onednn_conv_matches_torch(shape, k, stride, dilation, padding):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(5, shape[1], *k, generator=g, requires_grad=True)
    b = torch.randn(5, generator=g, requires_grad=True)
    conv = F.conv3d if len(shape) == 5 else F.conv2d
    ref = conv(x, w, b, stride, padding, dilation)
    grad = torch.randn(ref.shape, generator=g)
    want = torch.autograd.grad(ref, (x, w, b), grad)
    out = OneDnnConv.apply(x, w, b, padding, stride, dilation, 1, 2)
    got = torch.autograd.grad(out, (x, w, b), grad)
    # the backward under test is the cut one, not torch's fallback
    assert _halves(x.detach(), grad, w, stride, dilation, 1, 2) is not None
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for name, a, e in zip(("x", "weight", "bias"), got, want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_no_grad_for_weight_or_input():
    x = torch.randn(1, 8, 9, 20, 20)
    w = torch.randn(4, 8, 3, 3, 3, requires_grad=True)
    out = OneDnnConv.apply(x, w, None, (0, 1, 1), (1, 1, 1), (1, 1, 1), 1, 2)
    (gw,) = torch.autograd.grad(out.sum(), (w,))
    ref = torch.autograd.grad(F.conv3d(x, w, None, 1, (0, 1, 1)).sum(), (w,))[0]
    torch.testing.assert_close(gw, ref, rtol=1e-4, atol=1e-3)


def test_backward_has_no_column_buffer():
    """A thin slab torch would send to its native kernel: that kernel's column buffer is
    ``C_in * 27`` output slabs (about 22 input slabs here); the oneDNN backward needs a few."""
    x = torch.randn(1, 8, 10, 64, 64, requires_grad=True)
    w = torch.randn(8, 8, 3, 3, 3, requires_grad=True)
    assert not uses_onednn(x.shape, w.shape, (1, 1, 1), (1, 1, 1), 1, x)
    out = OneDnnConv.apply(x, w, None, (0, 1, 1), (1, 1, 1), (1, 1, 1), 1, 2)
    grad = torch.ones_like(out)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.autograd.grad(out, (x, w), grad)
    sizes = [e.nbytes() for e in prof.profiler.kineto_results.events()
             if e.name() == "[memory]" and e.nbytes() > 0]
    slab = x.numel() * x.element_size()
    assert max(sizes) <= 4 * slab, (max(sizes), slab)  # native: 27 * 8 output rows * 8 ch
