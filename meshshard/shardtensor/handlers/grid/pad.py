"""F.pad in every mode (constant, reflect, replicate, circular) along sharded dims.

Output row ``t`` of a padded dim reads input row ``t - pad_left`` mapped by the mode (reflect:
mirrored, replicate: clamped, circular: modulo N -- the first rank's left pad comes from the
last rank and vice versa); rows that cross a cut arrive by halo exchange. Output ``t`` belongs
to the owner of input ``clamp(t - pad_left)``: the left pad joins the first non-empty shard, the
right pad the last one; negative pads crop.
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from meshshard.shardtensor._layout import reduce_partials, wrap
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.handlers.grid._window import (
    DimPlan,
    empty_like_out,
    gather_windows,
    out_sizes_of,
    out_spec,
    ranges_of,
)
from meshshard.shardtensor.handlers.grid.conv import meta_of
from meshshard.shardtensor.registry import register_handler


def map_rows(src: np.ndarray, n: int, mode: str) -> np.ndarray:
    """Input row read by each (possibly out-of-range) source index; -1 = the fill value."""
    src = src.copy()
    out = (src < 0) | (src >= n)
    if mode == "constant":
        src[out] = -1
    elif mode == "reflect":
        src = np.where(src < 0, -src, src)
        src = np.where(src >= n, 2 * (n - 1) - src, src)
    elif mode == "replicate":
        src = np.clip(src, 0, n - 1)
    elif mode == "circular":
        src = np.mod(src, n)
    else:
        msg = f"F.pad mode={mode!r}: use constant, reflect, replicate or circular"
        raise ValueError(msg)
    return src


def pad_plan(dim, mesh_dim, sizes, pl, pr, mode) -> DimPlan:
    n = int(sum(sizes))
    m = n + pl + pr
    t = np.arange(m, dtype=np.int64)
    out_sizes = out_sizes_of(np.clip(t - pl, 0, max(n - 1, 0)), sizes)
    needs = []
    for t0, t1 in ranges_of(out_sizes):
        src = map_rows(np.arange(t0 - pl, t1 - pl, dtype=np.int64), n, mode)
        needs.append(tuple(src.tolist()))
    return DimPlan(dim, mesh_dim, out_sizes, tuple(needs), periodic=mode == "circular")


@register_handler(F.pad)
def _pad(input, pad, mode="constant", value=None):
    if not isinstance(input, ShardTensor):
        msg = "F.pad: only the input may be a ShardTensor"
        raise TypeError(msg)
    x = reduce_partials(input)
    spec = x._spec
    gout = F.pad(meta_of(x), pad, mode=mode, value=value)  # torch's checks on global shapes
    pad = [int(v) for v in pad]
    nd = spec.ndim
    local_pad = list(pad)
    plans = []
    for i, p in enumerate(spec.placements):
        d = getattr(p, "dim", None)
        if d is None or spec.sizes[i] is None:
            continue
        k = nd - 1 - d  # pair index in the pad tuple
        if 2 * k + 1 >= len(pad) or (pad[2 * k] == 0 and pad[2 * k + 1] == 0):
            continue
        if sum(spec.sizes[i]) == 0:
            msg = f"F.pad: dim {d} is sharded with global size 0"
            raise ValueError(msg)
        plans.append(pad_plan(d, i, spec.sizes[i], pad[2 * k], pad[2 * k + 1], mode))
        local_pad[2 * k] = local_pad[2 * k + 1] = 0
    if not plans:
        return wrap(F.pad(x._local, pad, mode=mode, value=value), spec.with_changes(
            shape=gout.shape))
    so = out_spec(spec, gout.shape, plans)
    fill = 0.0 if value is None else float(value)
    win = gather_windows(x._local, spec, plans, fill=fill)
    oshape = so.local_shape()
    if any(v == 0 for v in oshape):
        return wrap(empty_like_out(oshape, win, (win,)), so)
    if any(local_pad):
        win = F.pad(win, local_pad, mode=mode, value=value)
    return wrap(win, so)
