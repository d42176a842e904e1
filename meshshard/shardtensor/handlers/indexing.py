"""Basic indexing (``x[...]``) and narrow: ints, slices, None and Ellipsis on any dim (a slice of
the sharded dim keeps each rank's own rows, so nothing moves); integer tensors on unsharded dims.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate, Shard

from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._layout import LayoutError, reduce_partials, wrap
from meshshard.shardtensor._tracemode import constant
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import register_handler
from meshshard.shardtensor.spec import ShardSpec


def _slice_counts(sizes, start, stop, step):
    """Per-rank (local start, count) of global positions start:stop:step (step > 0)."""
    out = []
    off = 0
    for s in sizes:
        lo, hi = off, off + s
        a = max(lo, start)
        if a > start:
            r = (a - start) % step
            a += (step - r) % step
        b = min(hi, stop)
        cnt = 0 if b <= a else (b - a + step - 1) // step
        out.append((a - lo, cnt))
        off = hi
    return out


def _is_int_scalar(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    return (
        isinstance(v, torch.Tensor)
        and v.ndim == 0
        and not v.dtype.is_floating_point
        and v.dtype != torch.bool
    )


def _expand_index(idx, ndim):
    if not isinstance(idx, tuple):
        idx = (idx,)
    n_real = sum(1 for v in idx if v is not None and v is not Ellipsis and not isinstance(v, bool))
    out = []
    for v in idx:
        if v is Ellipsis:
            out.extend([slice(None)] * (ndim - n_real))
        else:
            out.append(v)
    if Ellipsis not in idx:
        out.extend([slice(None)] * (ndim - n_real))
    return out


@register_handler(torch.Tensor.__getitem__)
def _getitem(x, idx):
    if isinstance(idx, ShardTensor):
        msg = "indexing with a ShardTensor is not supported; use torch.where or masked ops"
        raise LayoutError(msg)
    x = reduce_partials(x)
    spec = x._spec
    items = _expand_index(idx, spec.ndim)
    local_idx: list = []
    out_shape: list[int] = []
    placements = list(spec.placements)
    sizes = list(spec.sizes)
    gather_after = []  # (mesh dim, output dim) for int indices on sharded dims
    in_to_out: dict[int, int] = {}
    d_in = 0
    shard_of = spec.shard_dims()
    n_adv = sum(isinstance(w, (torch.Tensor, list)) and not _is_int_scalar(w) for w in items)
    for v in items:
        if v is None:
            local_idx.append(None)
            out_shape.append(1)
            continue
        N = spec.shape[d_in]
        i = shard_of.get(d_in)
        if isinstance(v, slice):
            start, stop, step = v.indices(N)
            if step <= 0:
                msg = "slice step must be positive"
                raise ValueError(msg)
            in_to_out[d_in] = len(out_shape)
            if i is None:
                local_idx.append(v)
                out_shape.append(len(range(start, stop, step)))
            else:
                cnts = _slice_counts(spec.sizes[i], start, stop, step)
                a, c = cnts[spec.coordinate()[i]]
                local_idx.append(slice(a, a + (c - 1) * step + 1 if c else a, step))
                out_shape.append(sum(c for _, c in cnts))
                sizes[i] = tuple(c for _, c in cnts)
        elif _is_int_scalar(v):
            v = int(v)
            if v < -N or v >= N:
                msg = f"index {v} is out of bounds for dim {d_in} with size {N}"
                raise IndexError(msg)
            v = v + N if v < 0 else v
            if i is None:
                local_idx.append(v)
            else:
                cnts = _slice_counts(spec.sizes[i], v, v + 1, 1)
                a, c = cnts[spec.coordinate()[i]]
                local_idx.append(slice(a, a + c))
                in_to_out[d_in] = len(out_shape)
                gather_after.append((i, len(out_shape)))
                out_shape.append(1)
                sizes[i] = tuple(c for _, c in cnts)
        elif isinstance(v, (torch.Tensor, list)) and i is None:
            t = v if isinstance(v, torch.Tensor) else constant(v)
            if t.dtype == torch.bool or t.ndim != 1 or n_adv > 1:
                msg = "only one 1-D integer index tensor (on an unsharded dim) is supported"
                raise NotImplementedError(msg)
            local_idx.append(t.to(x._local.device))
            in_to_out[d_in] = len(out_shape)
            out_shape.append(t.numel())
        else:
            msg = (
                f"index {type(v).__name__} on dim {d_in} of a ShardTensor is not supported "
                "(sharded dims take ints and slices; use index_select for index tensors)"
            )
            raise NotImplementedError(msg)
        d_in += 1
    for i, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            placements[i] = Shard(in_to_out[p.dim])
    local = x._local[tuple(local_idx)]
    out = wrap(local, ShardSpec(spec.mesh, tuple(placements), tuple(sizes),
                                torch.Size(out_shape)))
    for i, od in gather_after:
        # the one selected row lives on one rank: gather it to everyone, drop the dim
        g = C.all_gather_v(out._local, od, out._spec.sizes[i], spec.mesh.get_group(i))
        pl = list(out._spec.placements)
        sz = list(out._spec.sizes)
        pl[i], sz[i] = Replicate(), None
        out = wrap(g, ShardSpec(spec.mesh, tuple(pl), tuple(sz), out._spec.shape))
    if gather_after:
        dims = [od for _, od in gather_after]
        out = out.squeeze(tuple(dims))
    return out


@register_handler(torch.narrow, torch.Tensor.narrow)
def _narrow(x, dim, start, length):
    nd = x._spec.ndim
    d = dim + nd if dim < 0 else dim
    idx = [slice(None)] * nd
    idx[d] = slice(int(start), int(start) + int(length))
    return _getitem(x, tuple(idx))
