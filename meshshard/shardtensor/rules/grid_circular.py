"""Circular padding on sharded grids.

``F.pad(mode="circular")`` decomposes above aten into ``as_strided``/``copy_`` on the padded
dims, which no rule can follow along a sharded dim. So on a ShardTensor ``F.pad`` with
``mode="circular"`` becomes one custom op, ``meshshard::grid_pad_circular``, with a registered
autograd formula whose backward is a second custom op. Both have rules here: today's periodic
``pad_plan`` (the first rank's left pad comes from the last rank and vice versa), the window
from :mod:`.grid_halo`, and its adjoint in backward. On plain tensors the ops are ``F.pad``
and its gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshshard.shardtensor._aten.grid_halo import tie
from meshshard.shardtensor.rules.grid_conv import (
    ShardTensor,
    empty_window,
    gather,
    gather_transpose,
    grad_local,
    local_shape,
    register_rule,
    window_shape,
)
from meshshard.shardtensor.rules.grid_window import _pad_setup


def _padded_shape(x, pad):
    shape = list(x.shape)
    for k in range(len(pad) // 2):
        shape[x.ndim - 1 - k] += pad[2 * k] + pad[2 * k + 1]
    return shape


@torch.library.custom_op("meshshard::grid_pad_circular", mutates_args=())
def grid_pad_circular(x: torch.Tensor, pad: list[int]) -> torch.Tensor:
    return F.pad(x, pad, mode="circular")


@grid_pad_circular.register_fake
def _(x, pad):
    return x.new_empty(_padded_shape(x, pad))


def circular_fold(g: torch.Tensor, pad) -> torch.Tensor:
    """Adjoint of circular padding: the pad rows' gradients added to the rows they copy (no
    autograd: it also runs below it, inside the rules)."""
    nd = g.ndim
    for k in range(len(pad) // 2):
        d, pl, pr = nd - 1 - k, int(pad[2 * k]), int(pad[2 * k + 1])
        n = g.shape[d] - pl - pr
        core = g.narrow(d, pl, n)
        if pl:
            core = core.slice_scatter(core.narrow(d, n - pl, pl) + g.narrow(d, 0, pl), d,
                                      n - pl, n)
        if pr:
            core = core.slice_scatter(core.narrow(d, 0, pr) + g.narrow(d, pl + n, pr), d, 0,
                                      pr)
        g = core
    return g


@torch.library.custom_op("meshshard::grid_pad_circular_backward", mutates_args=())
def grid_pad_circular_backward(g: torch.Tensor, x: torch.Tensor,
                               pad: list[int]) -> torch.Tensor:
    return circular_fold(g, pad).clone()


@grid_pad_circular_backward.register_fake
def _(g, x, pad):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.pad = list(inputs[1])


def _backward(ctx, g):
    (x,) = ctx.saved_tensors
    return torch.ops.meshshard.grid_pad_circular_backward(g, x, ctx.pad), None


grid_pad_circular.register_autograd(_backward, setup_context=_setup)


@register_rule(torch.ops.meshshard.grid_pad_circular.default, direct=True)
def _pad_fwd(func, args, kwargs):
    x, pad = args
    local, spec, _, so, exs, lpad = _pad_setup(x, pad, "circular", "F.pad(mode='circular')")
    win = gather(local, spec, exs)
    oshape = local_shape(so)
    if any(v == 0 for v in oshape) or empty_window(win.shape, [e.dim for e in exs]):
        return ShardTensor(tie(win.new_zeros(oshape), win), so)
    return ShardTensor(F.pad(win, lpad, mode="circular") if any(lpad) else win, so)


@register_rule(torch.ops.meshshard.grid_pad_circular_backward.default, direct=True)
def _pad_bwd(func, args, kwargs):
    g, x, pad = args
    local, spec, _, so, exs, lpad = _pad_setup(x, pad, "circular", "F.pad(mode='circular')")
    gl = grad_local(g, so)
    wshape = window_shape(local.shape, exs)
    if any(v == 0 for v in gl.shape) or empty_window(wshape, [e.dim for e in exs]):
        gwin = tie(local.new_zeros(wshape), gl)
    elif any(lpad):
        gwin = circular_fold(gl, lpad)
    else:
        gwin = gl
    return ShardTensor(gather_transpose(gwin, spec, exs), spec)


def _pad_rule(input, pad, mode="constant", value=None):
    """``F.pad`` on a ShardTensor, circular mode: the custom op (else NotImplemented)."""
    if mode == "circular" and type(input) is ShardTensor:
        return torch.ops.meshshard.grid_pad_circular(input, [int(v) for v in pad])
    return NotImplemented


# F.pad reaches the wrapper's __torch_function__: a function-level rule
register_rule(F.pad)(_pad_rule)
