"""Message passing on the aten-level ShardTensor: row-local gather and scatter, and the ghost
refresh, as custom ops with autograd formulas.

A graph's node tensor lives in one of two layouts, both ``Shard(0)`` on a 1-D mesh:

- *owned*: every rank its owned nodes (the partition's sizes);
- *extended*: every rank its owned nodes then copies of its ghost nodes (sizes
  ``n_owned + n_ghost`` per rank). Globally it is the concatenation of every rank's local
  rows, duplicates included; ghost rows carry values equal to their owners' and gradients of
  their own (from the edges that read them), which the refresh's backward sums into the owners.

Edge tensors are ``Shard(0)`` over the edges each rank owns (the edge ``i -> j`` lives with the
owner of ``j``), and an edge index is such a tensor whose values are rows of the extended node
tensor *on the same rank* (global extended row ids). Gathering by it (``h[src]``,
``h.index_select(0, src)``) and scattering into it are then local, and exactly the global
operations: nothing moves except in the refresh, which moves only the ghost rows (one uneven
all-to-all, a functional collective, so it traces under ``torch.compile``).

All ops are differentiable to any order: each backward is made of these same ops.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Shard

from meshshard.shardtensor._aten.dispatch import (
    _coord,
    _fc,
    check,
)
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import ShardTensor, make_spec

_REDUCES = ("sum", "mean", "max")


def _rows_spec(x: ShardTensor, what: str):
    spec = x._spec
    if spec.mesh.ndim != 1 or spec.placements[0] != Shard(0):
        msg = f"{what}: needs a Shard(0) ShardTensor on a 1-D mesh, got {spec}"
        raise ValueError(msg)
    return spec


def _offset(spec) -> int:
    return sum(spec.sizes[0][: _coord(spec.mesh)[1][0]])


# (id of the index ShardTensor's view base, its version, local data pointer, shape, stride) ->
# (weakref to that base, lowest value, highest value): a row index is range-checked once, not
# on every layer (``edge_index[0]`` is a new view of the same base every time)
_RANGES: dict[tuple, tuple] = {}
_RANGES_MAX = 256


def _range_key(idx: ShardTensor) -> tuple:
    base = idx._base if idx._base is not None else idx
    local = idx._local
    return base, (id(base), base._version, local.data_ptr(), tuple(local.shape), local.stride())


def note_index_range(idx: ShardTensor, lo: int, hi: int) -> None:
    """Record that every value of this rank's piece of the row index ``idx`` lies in
    ``[lo, hi]``, known without reading it back (e.g. from the host arrays it was built from),
    so that its row gather/scatter range check needs no host sync. The record covers ``idx``
    and equal views of the same base (``edge_index[0]`` taken again), while that base lives
    and is not changed in place through the ShardTensor."""
    import weakref

    base, key = _range_key(idx)
    if len(_RANGES) >= _RANGES_MAX:
        for k in [k for k, (ref, *_) in _RANGES.items() if ref() is None]:
            del _RANGES[k]
        if len(_RANGES) >= _RANGES_MAX:
            _RANGES.clear()
    _RANGES[key] = (weakref.ref(base), int(lo), int(hi))


def _index_range(idx: ShardTensor) -> tuple[int, int]:
    """(min, max) of a non-empty local index: from the record when there is one, else read
    back in one host sync (and recorded: the same index in the next layer is free)."""
    base, key = _range_key(idx)
    hit = _RANGES.get(key)
    if hit is not None and hit[0]() is base:
        return hit[1], hit[2]
    lo, hi = torch.stack(torch.aminmax(idx._local)).tolist()  # host sync: once per index
    note_index_range(idx, lo, hi)
    return int(lo), int(hi)


def _local_ids(x_spec, idx: ShardTensor, what: str) -> torch.Tensor:
    """This rank's indices as rows of its local piece of ``x``; checked eagerly (a row-local
    gather is exact only if every index names a row of the same rank). The check reads the
    index's range back once per index tensor (one host sync; none when its range was noted,
    see :func:`note_index_range`), then reuses it while the index is unchanged; on the meta
    device (no values) it is skipped."""
    off = _offset(x_spec)
    local = idx._local
    if type(local) is torch.Tensor and local.numel() and local.device.type != "meta":
        n = x_spec.sizes[0][_coord(x_spec.mesh)[1][0]]
        lo, hi = _index_range(idx)
        lo, hi = lo - off, hi - off
        if lo < 0 or hi >= n:
            msg = (
                f"{what}: rank {_coord(x_spec.mesh)[1][0]} indexes rows {lo + off}..{hi + off}, "
                f"outside its own rows {off}..{off + n - 1}; an index sharded like the rows it "
                "indexes must name rows of its own shard (use meshshard.graph's plug, which "
                "builds such indices, or redistribute)"
            )
            raise ValueError(msg)
    return local - off


# ------------------------------------------------------------------ row gather / scatter
@torch.library.custom_op("meshshard::row_gather", mutates_args=())
def _row_gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    msg = "meshshard::row_gather takes ShardTensors"
    raise TypeError(msg)


@_row_gather.register_fake
def _(x, idx):
    return x.new_empty((idx.shape[0], *x.shape[1:]))


@torch.library.custom_op("meshshard::row_scatter", mutates_args=())
def _row_scatter(src: torch.Tensor, idx: torch.Tensor, like: torch.Tensor,
                 reduce: str) -> torch.Tensor:
    msg = "meshshard::row_scatter takes ShardTensors"
    raise TypeError(msg)


@_row_scatter.register_fake
def _(src, idx, like, reduce):
    return src.new_empty((like.shape[0], *src.shape[1:]))


def row_gather(x: ShardTensor, idx: ShardTensor) -> ShardTensor:
    """``x[idx]`` for an index sharded like ``x``'s rows naming rows of the same rank."""
    return torch.ops.meshshard.row_gather(x, idx)


def row_scatter(src: ShardTensor, idx: ShardTensor, like: ShardTensor,
                reduce: str = "sum") -> ShardTensor:
    """Rows of ``like``'s layout: ``out[idx[e]] (+)= src[e]`` (sum, mean or max; rows without
    entries are 0, PyG's convention). ``idx`` names rows of ``like`` on the same rank."""
    if reduce not in _REDUCES:
        msg = f"reduce={reduce!r} must be one of {', '.join(map(repr, _REDUCES))}"
        raise ValueError(msg)
    return torch.ops.meshshard.row_scatter(src, idx, like, reduce)


def _gather_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])


def _gather_backward(ctx, g):
    x, idx = ctx.saved_tensors
    return row_scatter(g, idx, x, "sum"), None


_row_gather.register_autograd(_gather_backward, setup_context=_gather_setup)


def _scatter_setup(ctx, inputs, output) -> None:
    src, idx, like, reduce = inputs
    ctx.reduce = reduce
    ctx.save_for_backward(src, idx, like, output if reduce == "max" else None)


def _expand_rows(w: ShardTensor, ndim: int) -> ShardTensor:
    return w.reshape(w.shape[0], *([1] * (ndim - 1)))


def _scatter_backward(ctx, g):
    src, idx, like, out = ctx.saved_tensors
    if ctx.reduce == "sum":
        return row_gather(g, idx), None, None, None
    ones = torch.ones_like(idx, dtype=g.dtype)
    if ctx.reduce == "mean":
        cnt = row_scatter(ones, idx, like, "sum").clamp_min(1)
        return row_gather(g / _expand_rows(cnt, g.ndim), idx), None, None, None
    # max: the gradient goes to the entries equal to the maximum, shared equally among ties
    hit = (src == row_gather(out, idx)).to(g.dtype)
    ties = row_scatter(hit, idx, like, "sum").clamp_min(1)
    return hit * row_gather(g / ties, idx), None, None, None


_row_scatter.register_autograd(_scatter_backward, setup_context=_scatter_setup)


def _row_local(x, idx) -> bool:
    """Both Shard(0) on the same 1-D mesh: the row-local case. Otherwise ``x[idx]`` has its
    ordinary meaning and the generic rules handle it."""
    if type(x) is not ShardTensor or type(idx) is not ShardTensor:
        return False
    xs, is_ = x._spec, idx._spec
    return (xs.mesh is is_.mesh and xs.mesh.ndim == 1 and xs.placements[0] == Shard(0)
            and is_.placements[0] == Shard(0))


def _gather_rule(func, args, kwargs) -> ShardTensor:
    x, idx = args
    if not _row_local(x, idx):
        return torch.ops.aten.index_select.default(x, 0, idx)
    xs, is_ = x._spec, idx._spec
    out = x._local.index_select(0, _local_ids(xs, idx, "row gather"))
    spec = make_spec(xs.mesh, xs.placements, is_.sizes, (idx.shape[0], *x.shape[1:]))
    return ShardTensor(out, spec)


def _scatter_rule(func, args, kwargs) -> ShardTensor:
    src, idx, like, reduce = args
    if not (_row_local(like, idx) and _row_local(src, idx)):
        if reduce != "sum":
            msg = (f"row scatter with reduce={reduce!r} needs the index, the values and the "
                   "target all Shard(0) on one 1-D mesh")
            raise ValueError(msg)
        aten = torch.ops.aten  # the adjoint of an ordinary x[idx]: generic rules
        zeros = aten.new_zeros.default(src, [like.shape[0], *src.shape[1:]])
        return aten.index_add.default(zeros, 0, idx, src)
    ls = _rows_spec(like, "row scatter (target)")
    ss = _rows_spec(src, "row scatter (values)")
    if _rows_spec(idx, "row scatter (index)").sizes != ss.sizes:
        msg = (f"row scatter: the index's sizes {idx._spec.sizes[0]} differ from the values' "
               f"{ss.sizes[0]}; give one index per value row")
        raise ValueError(msg)
    ids = _local_ids(ls, idx, "row scatter")
    vals = src._local
    rows = ls.sizes[0][_coord(ls.mesh)[1][0]]
    feat = vals.shape[1:]
    out = vals.new_zeros((rows, *feat))
    if reduce == "max":
        ix = ids.reshape(-1, *([1] * len(feat))).expand_as(vals)
        out = out.scatter_reduce(0, ix, vals, reduce="amax", include_self=False)
    else:
        out = out.index_add(0, ids, vals)
        if reduce == "mean":
            cnt = torch.zeros(rows, dtype=vals.dtype, device=vals.device).index_add(
                0, ids, torch.ones_like(ids, dtype=vals.dtype)).clamp_min(1)
            out = out / cnt.reshape(-1, *([1] * len(feat)))
    spec = make_spec(ls.mesh, ls.placements, ls.sizes, (like.shape[0], *feat))
    return ShardTensor(out, spec)


# ------------------------------------------------------------------ ghost refresh
@torch.library.custom_op("meshshard::ghost_refresh", mutates_args=())
def _ghost_refresh(x: torch.Tensor, send_idx: torch.Tensor, send: list[int], recv: list[int],
                   owned: list[int], extended: list[int]) -> torch.Tensor:
    msg = "meshshard::ghost_refresh takes a ShardTensor"
    raise TypeError(msg)


@_ghost_refresh.register_fake
def _(x, send_idx, send, recv, owned, extended):
    return x.new_empty((sum(extended), *x.shape[1:]))


@torch.library.custom_op("meshshard::ghost_refresh_adjoint", mutates_args=())
def _ghost_adjoint(g: torch.Tensor, send_idx: torch.Tensor, send: list[int], recv: list[int],
                   owned: list[int], extended: list[int], into: list[int]) -> torch.Tensor:
    msg = "meshshard::ghost_refresh_adjoint takes a ShardTensor"
    raise TypeError(msg)


@_ghost_adjoint.register_fake
def _(g, send_idx, send, recv, owned, extended, into):
    return g.new_empty((sum(into), *g.shape[1:]))


def ghost_refresh(x: ShardTensor, send_idx: torch.Tensor, send: list[int],
                  recv: list[int], owned: list[int], extended: list[int]) -> ShardTensor:
    """Owned rows of ``x`` (owned or extended layout) then fresh ghost rows: the extended
    layout. ``send_idx``: this rank's owned rows to send, grouped by destination (``send``
    rows to each rank); ``recv``: ghost rows from each rank. Collective."""
    return torch.ops.meshshard.ghost_refresh(x, send_idx, send, recv, owned, extended)


def _refresh_setup(ctx, inputs, output) -> None:
    x, send_idx, send, recv, owned, extended = inputs
    ctx.args = (send, recv, owned, extended, list(x._spec.sizes[0]))
    ctx.save_for_backward(send_idx)


def _refresh_backward(ctx, g):
    (send_idx,) = ctx.saved_tensors
    send, recv, owned, extended, into = ctx.args
    gx = torch.ops.meshshard.ghost_refresh_adjoint(g, send_idx, send, recv, owned, extended,
                                                   into)
    return gx, None, None, None, None, None


def _adjoint_setup(ctx, inputs, output) -> None:
    g, send_idx, send, recv, owned, extended, into = inputs
    ctx.args = (send, recv, owned, extended)
    ctx.save_for_backward(send_idx)


def _adjoint_backward(ctx, gg):
    (send_idx,) = ctx.saved_tensors
    return (ghost_refresh(gg, send_idx, *ctx.args), None, None, None, None, None, None)


_ghost_refresh.register_autograd(_refresh_backward, setup_context=_refresh_setup)
_ghost_adjoint.register_autograd(_adjoint_backward, setup_context=_adjoint_setup)


def _a2a(t: torch.Tensor, out_splits: list, in_splits: list, mesh) -> torch.Tensor:
    if mesh.size(0) == 1:
        return t
    check("all_to_all", mesh, 0, t, "graph rows", varying_dim=0)
    return _fc.wait_tensor(_fc.all_to_all_single(t.contiguous(), out_splits, in_splits,
                                                 _coord(mesh)[2][0]))


def _refresh_rule(func, args, kwargs) -> ShardTensor:
    x, send_idx, send, recv, owned, extended = args
    xs = _rows_spec(x, "ghost refresh")
    if tuple(xs.sizes[0]) not in (tuple(owned), tuple(extended)):
        msg = (f"ghost refresh: the tensor's sizes {xs.sizes[0]} are neither the graph's owned "
               f"sizes {tuple(owned)} nor its extended sizes {tuple(extended)}")
        raise ValueError(msg)
    me = _coord(xs.mesh)[1][0]
    mine = x._local.narrow(0, 0, owned[me])
    ghosts = _a2a(mine.index_select(0, send_idx.to(mine.device)), list(recv), list(send),
                  xs.mesh)
    spec = make_spec(xs.mesh, xs.placements, (tuple(extended),), (sum(extended), *x.shape[1:]))
    return ShardTensor(torch.cat([mine, ghosts]), spec)


def _adjoint_rule(func, args, kwargs) -> ShardTensor:
    g, send_idx, send, recv, owned, extended, into = args
    gs = _rows_spec(g, "ghost refresh (gradient)")
    me = _coord(gs.mesh)[1][0]
    loc = g._local
    back = _a2a(loc.narrow(0, owned[me], extended[me] - owned[me]), list(send), list(recv),
                gs.mesh)
    mine = loc.narrow(0, 0, owned[me]).index_add(0, send_idx.to(loc.device), back)
    if into[me] != owned[me]:  # the input was extended: its ghost rows got no gradient
        mine = torch.cat([mine, loc.new_zeros((into[me] - owned[me], *loc.shape[1:]))])
    spec = make_spec(gs.mesh, gs.placements, (tuple(into),), (sum(into), *g.shape[1:]))
    return ShardTensor(mine, spec)


for _op, _fn in ((torch.ops.meshshard.row_gather.default, _gather_rule),
                 (torch.ops.meshshard.row_scatter.default, _scatter_rule),
                 (torch.ops.meshshard.ghost_refresh.default, _refresh_rule),
                 (torch.ops.meshshard.ghost_refresh_adjoint.default, _adjoint_rule)):
    register_rule(_op, direct=True)(_fn)


# ------------------------------------------------------------------ h[idx], index_select
def _is_row_index(idx) -> bool:
    return type(idx) is ShardTensor and not idx.dtype.is_floating_point and \
        idx.dtype != torch.bool and idx.ndim == 1


def _getitem(x, index):
    if type(x) is ShardTensor and _is_row_index(index):
        return row_gather(x, index)
    return NotImplemented


def _index_select(x, dim, index):
    if type(x) is ShardTensor and dim in (0, -x.ndim) and _is_row_index(index):
        return row_gather(x, index)
    return NotImplemented


register_rule(torch.Tensor.__getitem__)(_getitem)
register_rule(torch.Tensor.index_select, torch.index_select)(_index_select)
