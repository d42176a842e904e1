"""A convolution that stays on oneDNN in forward *and* backward, for sharded windows.

torch picks a CPU convolution backend from the input's shape (``use_mkldnn`` in
``ConvUtils.h``): a batch-1 float32 input with ``N*C*D1*D2 <= 20480`` goes to the native
im2col kernel. A thin slab of a grid that oneDNN handles whole falls below that line, and the
native kernel is several times slower and allocates a column buffer of ``C_in * prod(kernel)``
times the slab (182 MB for 8 channels on a 24x96x96 slab, more than the slab's activations).
The grid conv rule already calls ``torch.mkldnn_convolution`` in forward when the *global*
problem would use oneDNN, but autograd's backward of that op re-selects the backend from the
local shapes.

:class:`OneDnnConv` keeps the global problem's backend in backward: when torch would leave
oneDNN for this window, the window is cut into two overlapping halves along a dim without
padding (the sharded dim), stacked as a batch of two (a batch > 1 is oneDNN's by torch's own
rule), and the input gradient is put back together (overlapping rows summed). Extra cost: about
three copies of the window, against the native kernel's 27x column buffer.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def uses_onednn(shape, wshape, stride, dilation, groups, like: torch.Tensor) -> bool:
    """Would torch run a 2-D/3-D convolution of an input of ``shape`` through oneDNN?
    (torch 2.x's ``use_mkldnn`` heuristic for float32 CPU tensors.)"""
    if (like.device.type != "cpu" or like.dtype != torch.float32 or len(shape) < 4
            or not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled):
        return False
    n, c, d2, d3 = (int(v) for v in shape[:4])
    kw, kh = int(wshape[-1]), int(wshape[-2])
    strided = any(v != 1 for v in stride)
    dilated = any(v != 1 for v in dilation)
    first = strided or dilated or n >= 16 or kw != 1 or kh != 1 or torch.get_num_threads() > 1
    second = groups > 1 or (kw > 3 and kh > 3) or n > 1 or n * c * d2 * d3 > 20480
    return first and second


class OneDnnConv(torch.autograd.Function):
    """``torch.mkldnn_convolution`` whose backward also runs on oneDNN (see module doc).

    ``split_dim``: a spatial dim with zero padding along which a batch-1 window may be cut."""

    @staticmethod
    def forward(ctx, x, w, b, padding, stride, dilation, groups, split_dim):
        ctx.save_for_backward(x, w)
        ctx.conf = (tuple(padding), tuple(stride), tuple(dilation), int(groups), split_dim)
        ctx.bias_sizes = None if b is None else list(b.shape)
        return torch.mkldnn_convolution(x, w, b, tuple(padding), tuple(stride), tuple(dilation),
                                        int(groups))

    @staticmethod
    @once_differentiable  # double backward raises a clear error instead of guessing
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        padding, stride, dilation, groups, sd = ctx.conf
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                ctx.bias_sizes is not None and ctx.needs_input_grad[2]]
        g = g.contiguous()
        nd = x.dim() - 2
        half = _halves(x, g, w, stride, dilation, groups, sd)
        if half is None:
            gi, gw, gb = torch.ops.aten.convolution_backward(
                g, x, w, ctx.bias_sizes, stride, padding, dilation, False, [0] * nd, groups,
                mask)
        else:
            x2, g2, m1, length = half
            gi2, gw, gb = torch.ops.aten.convolution_backward(
                g2, x2, w, ctx.bias_sizes, stride, padding, dilation, False, [0] * nd, groups,
                mask)
            gi = _join(gi2, x.shape, sd, m1 * stride[sd - 2], length) if mask[0] else None
        return gi, gw, gb, None, None, None, None, None


def _halves(x, g, w, stride, dilation, groups, sd):
    """``(x2, g2, m1, length)``: the window as a batch of two overlapping halves along ``sd``
    (zero rows pad the second half), or None where torch keeps oneDNN anyway or no cut helps."""
    if sd is None or x.shape[0] != 1:
        return None
    if uses_onednn(x.shape, w.shape, stride, dilation, groups, x):
        return None
    two = (2, *x.shape[1:])
    if not uses_onednn(two, w.shape, stride, dilation, groups, x):
        return None  # (1x1 kernels on one thread: torch's native kernel either way)
    m = g.shape[sd]
    m1 = (m + 1) // 2
    if m < 2:
        return None
    a = sd - 2
    s, ext = stride[a], dilation[a] * (w.shape[sd] - 1)
    length = (m1 - 1) * s + ext + 1  # input rows read by m1 outputs
    n_in = x.shape[sd]
    start = m1 * s
    avail = max(0, min(length, n_in - start))
    shape = list(two)
    shape[sd] = length
    x2 = x.new_empty(shape)
    x2[0].copy_(x[0].narrow(sd - 1, 0, length))
    x2[1].narrow(sd - 1, 0, avail).copy_(x[0].narrow(sd - 1, start, avail))
    if avail < length:
        x2[1].narrow(sd - 1, avail, length - avail).zero_()
    gshape = list(g.shape)
    gshape[0], gshape[sd] = 2, m1
    g2 = g.new_empty(gshape)
    g2[0].copy_(g[0].narrow(sd - 1, 0, m1))
    g2[1].narrow(sd - 1, 0, m - m1).copy_(g[0].narrow(sd - 1, m1, m - m1))
    if m - m1 < m1:
        g2[1].narrow(sd - 1, m - m1, 1).zero_()
    return x2, g2, m1, length


def _join(gi2, shape, sd, start, length):
    """Input gradient of the window from the two halves' gradients (overlap summed)."""
    n_in = shape[sd]
    avail = max(0, min(length, n_in - start))
    gi = gi2.new_empty(shape)
    d = sd - 1
    out = gi[0]
    out.narrow(d, 0, length).copy_(gi2[0])
    if start > length:
        out.narrow(d, length, start - length).zero_()
    lo = max(start, length)  # first row the second half writes alone
    over = max(0, min(length, start + avail) - start) if start < length else 0
    if over:
        out.narrow(d, start, over).add_(gi2[1].narrow(d, 0, over))
    if start + avail > lo:
        k = start + avail - lo
        out.narrow(d, lo, k).copy_(gi2[1].narrow(d, lo - start, k))
    end = max(length, start + avail)
    if end < n_in:
        out.narrow(d, end, n_in - end).zero_()
    return gi
