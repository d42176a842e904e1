"""``view``/``reshape``/``_unsafe_view`` of ShardTensors: one rule, tried in three ways.

1. Every mesh dim's sharded coordinate (extent ``n``, flat stride ``sigma``, per-rank sizes
   ``s``) kept whole in one output dim (a merge, or a dim kept), or split by whole rows
   (``(B*H, N, D) -> (B, H, N, D)`` inside an einsum, with the batch sharded on mesh dim 0 and
   the points on mesh dim 1: ``B*H`` is sharded with sizes ``b_r * H``, and splitting it keeps
   every rank's rows whole), per mesh dim and independently of the others, so nothing moves.
   A split lands in the output dim ``od`` with the largest stride ``st < sigma * n``: with
   ``b = st / sigma`` dividing every ``s_r``, rank r holds rows ``[off_r / b, (off_r + s_r) /
   b)`` of that coordinate, ``Shard(od)`` with sizes ``s / b`` (``Blocked`` when dims before it
   merge into ``od`` too).
2. A split at multiples of the new inner extent (``(B, N, H*D) -> (B, N, H, D)`` with whole
   heads per rank) on several mesh dims: local, the shard moves to the first new dim of extent
   > 1 with sizes divided by the inner extent.
3. A split of a dim sharded on one mesh dim other than by whole rows (``(N*D,) -> (N, D)``
   with shard sizes not multiples of ``D``): the boundaries are rounded to whole rows of the
   new outer dim and the partial rows move (all-to-all, :func:`.shape.move_rows`), then the
   view is local.

Anything else (a merge of dims sharded on two mesh dims into one, a split that no way keeps)
raises, naming the shapes and the layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import Shard

from meshshard.shardtensor._aten.dispatch import (
    SHARDED,
    Plan,
    ShardTensor,
    _coord,
    _local_shape,
    _spec_with,
)
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import make_spec, shard_like
from meshshard.shardtensor.rules.shape import move_rows

aten = torch.ops.aten


@register_rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(func, args, kwargs) -> Plan:
    plan = _whole_rows_plan(args)
    if plan is None:
        plan = _split_plan(args)
    if plan is None:
        plan = _moving_plan(func, args)
    return plan


# ------------------------------------------------------------------ 1. whole rows, nothing moves
def _infer(shape, numel):
    shape = list(shape)
    if -1 in shape:
        k = shape.index(-1)
        rest = 1
        for j, s in enumerate(shape):
            if j != k:
                rest = rest * s
        shape[k] = numel // rest
    return shape


def _reshape(loc, shape, *_a, **_k):
    # the wrapper claims contiguous strides; the local piece may be a permuted view
    return loc.reshape(shape)


def view_plan(x: ShardTensor, shape: Any, place: Callable) -> Plan | None:
    """The plan of a view of ``x`` as ``shape`` that moves nothing: every sharded mesh dim
    ``i`` (placement ``p``, flat stride ``sigma`` of its dim) lands where ``place(in_shape,
    out_shape, i, p, sigma)`` says, ``(out dim, blocks, per-rank sizes)``; None when ``place``
    returns None for one of them."""
    spec = x._spec
    in_shape = list(x.shape)
    numel = 1
    for s in in_shape:
        numel = numel * s
    out_shape = _infer(shape, numel)
    placements, sizes = [], []
    local_out = list(out_shape)
    for i, p in enumerate(spec.placements):
        if not isinstance(p, SHARDED):
            placements.append(p)
            sizes.append(None)
            continue
        sigma = 1
        for t in in_shape[p.dim + 1:]:
            sigma = sigma * t
        found = place(in_shape, out_shape, i, p, sigma)
        if found is None:
            return None
        od, blocks, s = found
        placements.append(shard_like(p, od, blocks))
        sizes.append(s)
        local_out[od] = s[_coord(spec.mesh)[1][i]] * blocks
    return Plan((), ((1, local_out),), _reshape,
                _spec_with(spec, placements, sizes, out_shape))


def _mapped_plan(func, args) -> Plan:
    """Each sharded coordinate kept whole in one output dim (a merge, or a dim kept); raises
    NotImplementedError when the view splits one."""
    spec = args[0]._spec

    def place(in_shape, out_shape, i, p, sigma):
        found = _map_view_dim(out_shape, sigma, extent(spec, i))
        if found is None:
            msg = (
                f"{func}: reshape {tuple(in_shape)} -> {tuple(out_shape)} splits the sharded "
                f"dim {p.dim} (needs a redistribution first)"
            )
            raise NotImplementedError(msg)
        od, blocks, q = found
        return od, blocks, spec.sizes[i] if q == 1 else tuple(v * q for v in spec.sizes[i])

    return view_plan(args[0], args[1], place)


def extent(spec, i: int):
    """The extent of mesh dim ``i``'s sharded coordinate: the sum of its sizes, read from the
    global shape (under tracing the global shape and the per-rank sizes are separate symbols;
    ``N // N`` simplifies where ``N // sum(sizes)`` would guard)."""
    p = spec.placements[i]
    return spec.shape[p.dim] // getattr(p, "blocks", 1)


def _map_view_dim(outs: list, sigma, n):
    """Where a sharded coordinate of extent ``n`` and flat stride ``sigma`` lands in a view of
    shape ``outs``: (dim, blocks, q) when that dim's index is ``block * n * q + i * q + j``
    (the rows of every rank stay whole), else None."""
    stride = 1
    strides = []
    for s in reversed(outs):
        strides.append(stride)
        stride = stride * s
    strides.reverse()
    for od, (s, st) in enumerate(zip(outs, strides)):
        if s == 1 and n != 1:
            continue
        if st <= sigma < st * s or (n == 1 and st == sigma):
            if sigma % st:
                return None
            q = sigma // st
            if s % (n * q):
                return None
            return od, s // (n * q), q
    return None


def _strides(shape: list) -> list:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc = acc * s
    return out[::-1]


def map_split(outs: list, sigma, n, sizes: tuple):
    """Where a sharded coordinate (extent ``n``, flat stride ``sigma``, per-rank ``sizes``)
    lands in a view of shape ``outs`` when the view splits it: (dim, blocks, new sizes), or
    None when some rank's rows would not stay whole."""
    best = None
    for od, (s, st) in enumerate(zip(outs, _strides(outs))):
        if s != 1 and sigma < st < sigma * n and (best is None or st > best[1]):
            best = (od, st, s)
    if best is None:
        return None
    od, st, s = best
    if st % sigma:
        return None
    b = st // sigma
    if n % b or any(v % b for v in sizes):
        return None
    m = n // b
    if s % m:
        return None
    return od, s // m, tuple(v // b for v in sizes)


def _map(outs: list, sigma, n, sizes: tuple):
    found = _map_view_dim(outs, sigma, n)
    if found is not None:
        od, blocks, q = found
        return od, blocks, sizes if q == 1 else tuple(v * q for v in sizes)
    return map_split(outs, sigma, n, sizes)


def _whole_rows_plan(args) -> Plan | None:
    """Every sharded coordinate kept whole or split by whole rows, per mesh dim (nothing moves);
    None when one cannot be."""
    spec = args[0]._spec
    used = set()

    def place(in_shape, out_shape, i, p, sigma):
        found = _map(out_shape, sigma, extent(spec, i), spec.sizes[i])
        if found is None or found[0] in used:
            return None
        used.add(found[0])
        return found

    return view_plan(args[0], args[1], place)


# ------------------------------------------------------------------ 2. split at the inner extent
def _groups(ins: list, outs: list) -> list | None:
    """Pairs (input dims, output dims) of equal extent, in order; None if they do not pair."""
    gi = go = 0
    out = []
    try:
        while gi < len(ins) or go < len(outs):
            a, b = ins[gi], outs[go]
            gin, gout = [gi], [go]
            gi, go = gi + 1, go + 1
            while a != b:
                if a < b:
                    a, gin = a * ins[gi], [*gin, gi]
                    gi += 1
                else:
                    b, gout = b * outs[go], [*gout, go]
                    go += 1
            out.append((gin, gout))
    except IndexError:
        return None
    return out


def _split_plan(args) -> Plan | None:
    """A view that splits a sharded dim at multiples of the new inner extent (``(B, N, H*D) ->
    (B, N, H, D)`` with whole heads per rank): local, the shard moves to the first new dim of
    extent > 1 with sizes divided by the inner extent; None when it does not apply."""
    x = args[0]
    spec = x._spec
    shape = list(x.shape)
    if any(type(s) is not int for s in shape) or 0 in shape:
        return None
    out_shape = _infer(args[1], x.numel())
    if any(type(s) is not int for s in out_shape):
        return None
    groups = _groups(shape, list(out_shape))
    if groups is None:
        return None
    where = {d: g for g in groups for d in g[0]}
    placements, sizes, split, dims = list(spec.placements), list(spec.sizes), False, set()
    for i, p in enumerate(spec.placements):
        if not isinstance(p, SHARDED):
            continue
        if type(p) is not Shard:
            return None
        gin, gout = where[p.dim]
        if len(gin) != 1:  # a merge: the previous rule's
            return None
        # the shard goes to the first new dim of extent > 1 (size-1 dims before it hold no
        # rows); each rank's rows must be whole multiples of the dims after it
        j = next((j for j, o in enumerate(gout) if out_shape[o] != 1), len(gout) - 1)
        inner = 1
        for o in gout[j + 1:]:
            inner *= out_shape[o]
        if any(type(s) is not int or s % inner for s in spec.sizes[i]):
            return None
        split = split or len(gout) > 1
        placements[i] = Shard(gout[j])
        sizes[i] = tuple(s // inner for s in spec.sizes[i])
        dims.add(gout[j])
    if not split or len(dims) != sum(isinstance(p, SHARDED) for p in spec.placements):
        return None
    coord = _coord(spec.mesh)[1]
    local = list(out_shape)
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            local[p.dim] = sizes[i][coord[i]]
    out = make_spec(spec.mesh, tuple(placements), tuple(sizes), tuple(out_shape))
    return Plan((), ((1, local),), _reshape, out)


# ------------------------------------------------------------------ 3. split, rows move
def _rounded(sizes, b: int) -> tuple:
    """Per-rank counts of whole rows of ``b`` elements: the boundaries rounded to the nearest
    multiple of ``b``."""
    off, cuts = 0, [0]
    for s in sizes:
        off = off + s
        cuts.append((off + b // 2) // b)
    return tuple(cuts[r + 1] - cuts[r] for r in range(len(sizes)))


def _moving_plan(func, args) -> Plan:
    """The mapped view (:func:`_mapped_plan`), else a view that splits a dim sharded on one
    mesh dim other than by whole rows: the boundaries are rounded to whole rows of the new
    outer dim and the partial rows move (all-to-all), then the view is local."""
    try:
        plan = _mapped_plan(func, args)
    except NotImplementedError as e:
        err = e
    else:
        dims = [p.dim for p in plan.outs.placements if isinstance(p, SHARDED)]
        if len(set(dims)) != len(dims):
            msg = (f"{func}: {tuple(args[0].shape)} -> {tuple(args[1])} merges dims sharded on "
                   f"two mesh dims ({args[0]._spec}) into one; not supported")
            raise NotImplementedError(msg)
        return plan
    x, spec = args[0], args[0]._spec
    in_shape = list(x.shape)
    numel = 1
    for s in in_shape:
        numel = numel * s
    out_shape = _infer(args[1], numel)
    over = [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED)]
    if len(over) != 1 or getattr(spec.placements[over[0]], "blocks", 1) != 1:
        raise err
    i = over[0]
    p = spec.placements[i].dim
    # the split case: dims before p are kept, dim p becomes (a, b, ...) with a the new
    # sharded dim; rows of b*... elements of dim p stay whole after the move
    outer = 1
    for s in in_shape[:p]:
        outer = outer * s
    acc, od = 1, 0
    while od < len(out_shape) and acc < outer:
        acc = acc * out_shape[od]
        od += 1
    if acc != outer or od >= len(out_shape):
        raise err
    rest = 1
    for v in out_shape[od + 1:]:
        rest = rest * v
    inner = 1
    for v in in_shape[p + 1:]:
        inner = inner * v
    if out_shape[od] * rest != in_shape[p] * inner or out_shape[od] == 1:
        raise err
    # flatten dim p with the dims after it (each rank holds a contiguous run of that block),
    # move the run boundaries to multiples of ``rest`` (whole rows of the new dim od), view
    t = _rounded(tuple(v * inner for v in spec.sizes[i]), rest)
    mesh = spec.mesh
    me = _coord(mesh)[1][i]
    sizes = list(spec.sizes)
    sizes[i] = t
    out = make_spec(mesh, tuple(shard_like(q, od) if isinstance(q, SHARDED) else q
                                for q in spec.placements), tuple(sizes), tuple(out_shape))
    local_out = list(out_shape)
    local_out[od] = t[me]
    flat = tuple(v * inner for v in spec.sizes[i])
    starts = tuple(sum(flat[:r]) for r in range(mesh.size(i)))
    moved = tuple(v * rest for v in t)
    local_flat = list(_local_shape(spec)[:p]) + [flat[me]]

    def call(loc, *_a, **_k):
        loc = move_rows([(loc.reshape(local_flat), starts, flat)], p, moved, mesh, i)
        return loc.reshape(local_out)

    return Plan((), (), call, out)
