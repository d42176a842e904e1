"""conv1d/2d/3d on tensors sharded along spatial dims (uneven, 1-D or 2-D domain meshes).

Each rank fetches exactly the input rows its outputs read (halo rows from whichever ranks own
them, zero rows for the padding), then runs the ordinary convolution with no padding along the
sharded dims. Strides align to the global index (see ``_window`` for the ownership rule).
``padding_mode`` other than zeros reaches here as ``F.pad`` (nn.Conv pads first), which has its
own rule.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshshard.shardtensor._generic import replicated_apply
from meshshard.shardtensor._layout import check_same_mesh, reduce_partials, replicated_local, wrap
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.handlers.grid._onednn import OneDnnConv, uses_onednn
from meshshard.shardtensor.handlers.grid._window import (
    empty_like_out,
    gather_windows,
    out_spec,
    sharded_spatial,
    sliding_plan,
    tuple_arg,
)
from meshshard.shardtensor.registry import register_handler


def global_shape(t) -> torch.Size:
    return t._spec.shape if isinstance(t, ShardTensor) else t.shape


def meta_of(t):
    if isinstance(t, torch.Tensor):
        return torch.empty(global_shape(t), dtype=t.dtype, device="meta")
    return t


def local_of(t):
    return t._local if isinstance(t, ShardTensor) else t


def needs_rule(func, x, others, args, kwargs):
    """None when ``x`` is sharded (the rule applies); else the replicated result."""
    sts = [t for t in (x, *others) if isinstance(t, ShardTensor)]
    check_same_mesh(sts)
    if isinstance(x, ShardTensor) and not x._spec.is_replicated():
        return None
    if all(t._spec.is_replicated() for t in sts):
        return replicated_apply(func, args, kwargs)
    msg = f"{func.__name__}: only the input may be sharded; replicate the weight and bias"
    raise ValueError(msg)


def _conv_padding(padding, k, dl, stride, nd):
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * nd
        if padding == "same":
            out = []
            for i in range(nd):
                total = dl[i] * (k[i] - 1)
                out.append((total // 2, total - total // 2))
            return out
        msg = f"padding={padding!r} must be 'same', 'valid', an int or a tuple"
        raise ValueError(msg)
    p = tuple_arg(padding, nd, "padding")
    return [(v, v) for v in p]


def _conv_rule(nd: int, func):
    def handler(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        args = (input, weight, bias, stride, padding, dilation, groups)
        r = needs_rule(func, input, (weight, bias), args, {})
        if r is not None:
            return r
        x = reduce_partials(input)
        spec = x._spec
        # global-shape check: torch's own message on every rank for bad shapes / options
        gout = func(meta_of(x), meta_of(weight), meta_of(bias), stride, padding, dilation, groups)
        sharded = sharded_spatial(spec, nd, func.__name__)
        k = tuple(int(v) for v in global_shape(weight)[2:])
        st = tuple_arg(stride, nd, "stride")
        dl = tuple_arg(dilation, nd, "dilation")
        pads = _conv_padding(padding, k, dl, st, nd)
        first = spec.ndim - nd
        plans = []
        for d in sorted(sharded):
            a = d - first
            plans.append(sliding_plan(d, sharded[d], spec.sizes[sharded[d]], gout.shape[d],
                                      k[a], st[a], dl[a], pads[a][0]))
        so = out_spec(spec, gout.shape, plans)
        w = replicated_local(weight, so, {})
        b = None if bias is None else replicated_local(bias, so, {})
        win = gather_windows(x._local, spec, plans)
        oshape = so.local_shape()
        if any(v == 0 for v in oshape):
            return wrap(empty_like_out(oshape, win, (win, w, b)), so)
        # unsharded dims keep their padding (asymmetric 'same' is applied by hand)
        local_pad = []
        manual = [0] * (2 * nd)
        for a in range(nd):
            pl, pr = pads[a]
            if first + a in sharded:
                local_pad.append(0)
            elif pl == pr:
                local_pad.append(pl)
            else:
                local_pad.append(0)
                manual[2 * (nd - 1 - a)] = pl
                manual[2 * (nd - 1 - a) + 1] = pr
        if any(manual):
            win = F.pad(win, manual)
        if win.dim() == nd + 2 and uses_onednn(spec.shape, global_shape(weight), st, dl, groups,
                                               win):
            # torch picks its conv backend from the input's shape, in forward and again in
            # backward; a thin slab would fall to the slow native kernel (a column buffer of
            # C_in * prod(kernel) slabs, several times the time) where the whole grid does not
            out = OneDnnConv.apply(win, w, b, tuple(local_pad), st, dl, groups,
                                   min(sharded) if sharded else None)
        else:
            out = func(win, w, b, st, tuple(local_pad), dl, groups)
        return wrap(out, so)

    return handler


for _nd, _f in ((1, F.conv1d), (2, F.conv2d), (3, F.conv3d)):
    register_handler(_f)(_conv_rule(_nd, _f))
