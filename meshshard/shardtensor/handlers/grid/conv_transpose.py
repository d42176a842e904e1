"""conv_transpose1d/2d/3d on tensors sharded along spatial dims.

Output ``t`` belongs to the owner of input ``(t + pad) // stride``. Each rank fetches the inputs
whose footprint reaches its outputs, runs the transposed convolution with no padding along the
sharded dims, and keeps (or zero-fills) exactly its global output range; the bias is added last.
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from meshshard.shardtensor._layout import reduce_partials, replicated_local, wrap
from meshshard.shardtensor.handlers.grid._window import (
    DimPlan,
    empty_like_out,
    gather_windows,
    out_sizes_of,
    out_spec,
    ranges_of,
    sharded_spatial,
    tuple_arg,
)
from meshshard.shardtensor.handlers.grid.conv import global_shape, meta_of, needs_rule
from meshshard.shardtensor.registry import register_handler


def transpose_plan(dim, mesh_dim, sizes, m, k, s, dl, p):
    """Plan plus, per rank, the global raw position of its window's first output."""
    n = int(sum(sizes))
    t = np.arange(m, dtype=np.int64)
    out_sizes = out_sizes_of(np.clip((t + p) // s, 0, n - 1), sizes)
    needs, starts = [], []
    for t0, t1 in ranges_of(out_sizes):
        i0 = max(0, -(-(t0 + p - dl * (k - 1)) // s))
        i1 = min(n - 1, (t1 - 1 + p) // s)
        if t1 == t0 or i0 > i1:
            needs.append(())
            starts.append(0)
            continue
        needs.append(tuple(range(i0, i1 + 1)))
        starts.append(t0 + p - i0 * s)
    return DimPlan(dim, mesh_dim, out_sizes, tuple(needs)), tuple(starts)


def _rule(nd, func):
    def handler(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                dilation=1):
        args = (input, weight, bias, stride, padding, output_padding, groups, dilation)
        r = needs_rule(func, input, (weight, bias), args, {})
        if r is not None:
            return r
        x = reduce_partials(input)
        spec = x._spec
        gout = func(meta_of(x), meta_of(weight), meta_of(bias), stride, padding, output_padding,
                    groups, dilation)
        sharded = sharded_spatial(spec, nd, func.__name__)
        k = tuple(int(v) for v in global_shape(weight)[2:])
        st, dl = tuple_arg(stride, nd, "stride"), tuple_arg(dilation, nd, "dilation")
        p, op = tuple_arg(padding, nd, "padding"), tuple_arg(output_padding, nd, "output_padding")
        first = spec.ndim - nd
        plans, starts = [], {}
        for d in sorted(sharded):
            a = d - first
            plan, st0 = transpose_plan(d, sharded[d], spec.sizes[sharded[d]], gout.shape[d], k[a],
                                       st[a], dl[a], p[a])
            plans.append(plan)
            starts[d] = st0[spec.mesh.get_local_rank(sharded[d])]
        so = out_spec(spec, gout.shape, plans)
        w = replicated_local(weight, so, {})
        b = None if bias is None else replicated_local(bias, so, {})
        win = gather_windows(x._local, spec, plans)
        oshape = so.local_shape()
        shape_c = [1] * spec.ndim
        shape_c[first - 1] = -1
        if any(v == 0 for v in oshape) or any(win.shape[d] == 0 for d in sharded):
            out = empty_like_out(oshape, win, (win, w))
            return wrap(out if b is None else out + b.reshape(shape_c), so)
        lp = tuple(0 if first + a in sharded else p[a] for a in range(nd))
        lop = tuple(0 if first + a in sharded else op[a] for a in range(nd))
        raw = func(win, w, None, st, lp, lop, groups, dl)
        crop = [0] * (2 * nd)
        for d in sharded:
            a = d - first
            lo = starts[d]
            crop[2 * (nd - 1 - a)] = -lo
            crop[2 * (nd - 1 - a) + 1] = lo + oshape[d] - raw.shape[d]
        out = F.pad(raw, crop) if any(crop) else raw
        if b is not None:
            out = out + b.reshape(shape_c)
        return wrap(out, so)

    return handler


for _nd, _f in ((1, F.conv_transpose1d), (2, F.conv_transpose2d), (3, F.conv_transpose3d)):
    register_handler(_f)(_rule(_nd, _f))
