"""Making and re-laying-out :class:`ShardTensor`: ``from_local`` with the library's checks,
and ``redistribute`` between Shard (any uneven sizes), Replicate and Partial('sum').

Both are autograd functions on the wrapper, so gradients of any order flow through them:
the backward of a redistribute is the redistribute of the gradient back to the input's layout
(whatever layout the gradient arrived in). Collectives are functional collectives, so they
trace under ``torch.compile`` as graph nodes. Only rows that change owner move when a Shard dim
gets new sizes (one uneven all-to-all).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.shardtensor._aten.dispatch import (
    _all_gather_v,
    _all_reduce,
    _coord,
    _fc,
    _narrow,
    check,
)
from meshshard.shardtensor._aten.layout_args import even_sizes, resolve_layout
from meshshard.shardtensor._aten.registry import register_rule
from meshshard.shardtensor._aten.tensor import (
    LATE,
    SHARDED,
    ASpec,
    Blocked,
    ShardTensor,
    _FromLocal,
    make_spec,
)

__all__ = ["from_local", "redistribute"]


def from_local(
    local: torch.Tensor,
    mesh,
    placements: Sequence[Any],
    sharding_shapes: Any = None,
    *,
    validate: bool = True,
) -> ShardTensor:
    """Wrap this rank's piece of a tensor laid out over ``mesh`` (differentiable w.r.t.
    ``local``).

    Collective: every rank of the mesh must call this, with the same ``validate``.

    Parameters
    ----------
    local : Tensor
        This rank's piece (a plain tensor; a ShardTensor's piece is its ``.to_local()``).
    mesh : DeviceMesh
    placements : list of Shard / Replicate / Partial
        One per mesh dim. Partial('avg'|'max'|'min') pieces are reduced here (one all-reduce
        per such mesh dim); Partial('sum') stays pending.
    sharding_shapes : optional
        Every rank's size of each sharded dim: a flat list of sizes (one Shard placement), a
        list per mesh dim, a dict ``{mesh_dim: sizes or per-rank shapes}``, or on a 1-D mesh a
        list of per-rank shapes. ``None`` infers them from the exchanged shapes.
    validate : bool
        ``True`` (default): before anything is judged, every rank's arguments (placements,
        declared sizes, the piece's ndim, shape, dtype and device type, and whether its own
        checks passed) travel in one small all-gather per mesh dim of size > 1, whatever the
        placements; every rank then raises the same one-line error naming the rank at fault
        and what it passed, or none raises. A mesh of one rank costs nothing. A Replicate or
        Partial piece pays this exchange too: a rank that skipped it because its placements
        say "no sharding" would leave a rank that was told Shard waiting in the shape
        exchange (or pair it with a later, unrelated collective).

        ``False``: no collective at all when the sizes are given or nothing is sharded (the
        form the library's own ops use inside a step); with ``sharding_shapes=None`` and a
        Shard placement, the shapes are still exchanged along the Shard mesh dims (sizes
        cannot be inferred otherwise), and what they show is still judged. This rank's own
        arguments are checked (its declared size against its piece; the forms of the
        arguments) and raise here at once; everything across ranks is trusted: the same
        placements, the same declared sizes, one dtype, one device type, equal sizes outside
        the sharded dims. If that promise is broken, this rank's error leaves the others
        waiting for the collective timeout; different placements or sizes give a ShardTensor
        whose recorded layout is false, so a later collective pairs with the wrong call,
        exchanges the wrong number of rows (gloo aborts the process: "Received data size
        doesn't match") or gives wrong values without an error; different dtypes abort gloo
        in the first collective.

    Returns
    -------
    ShardTensor

    Raises
    ------
    LayoutError, TypeError, NotImplementedError
        On every rank alike (``validate=True``): malformed placements or sizes, declared sizes
        that are not the pieces' sizes, or ranks that disagree on placements, ndim, dtype,
        device type or the sizes outside the sharded dims. The message names the rank(s) at
        fault and what they passed.
    RuntimeError
        This rank is not part of ``mesh`` (raised on that rank only).
    """
    placements = list(placements) if isinstance(placements, (list, tuple)) else placements
    placements, sizes, shape = resolve_layout(local, mesh, placements, sharding_shapes,
                                              validate=validate)
    placements = list(placements)
    if any(isinstance(p, Partial) and p.reduce_op != "sum" for p in placements):
        local, placements = _reduce_partials(local, mesh, placements)
    sizes = tuple(None if s is None else tuple(int(v) for v in s) for s in sizes)
    spec = make_spec(mesh, tuple(placements), sizes, tuple(shape))

    return _FromLocal.apply(local, spec)


def _reduce_partials(local: torch.Tensor, mesh, placements: list) -> tuple[torch.Tensor, list]:
    """Partial('avg'|'max'|'min') pieces reduced now (one all-reduce per such mesh dim,
    differentiable) and their dims made Replicate: only Partial('sum') stays pending, since
    every rule treats a pending Partial as a sum."""
    out = list(placements)
    for i, p in enumerate(placements):  # reduce ops checked by resolve_layout
        if not isinstance(p, Partial) or p.reduce_op == "sum":
            continue
        local = _PartialReduce.apply(local, mesh, i, p.reduce_op)
        out[i] = Replicate()
    return local, out


class _PartialReduce(torch.autograd.Function):
    """The all-reduce of one mesh dim's pieces by avg, max or min; the backward gives each
    piece its share: ``g / n`` for avg, and for max/min ``g`` split evenly among the pieces
    that attain the extremum (torch.amax's rule on the stacked pieces)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, mesh, i: int, op: str) -> torch.Tensor:
        n = mesh.size(i)
        ctx.n, ctx.op, ctx.mesh, ctx.i = n, op, mesh, i
        if n == 1:
            return local.clone()
        name = _coord(mesh)[2][i]
        check("all_reduce", mesh, i, local, f"Partial({op})")
        red = _fc.wait_tensor(_fc.all_reduce(local.contiguous(), "sum" if op == "avg" else op,
                                             name))
        if op == "avg":
            return red / n
        hit = (local == red).to(local.dtype)
        ctx.share = hit / _all_reduce(hit, mesh, i)
        return red

    @staticmethod
    def backward(ctx, g):
        if ctx.n == 1:
            return g, None, None, None
        return (g / ctx.n if ctx.op == "avg" else g * ctx.share), None, None, None


# ------------------------------------------------------------------ redistribute
def _target(spec: ASpec, placements: tuple | None, want: list) -> tuple[tuple, tuple]:
    """Validated target layout: ``want`` holds, per mesh dim, the requested sizes or None."""
    mesh = spec.mesh
    if placements is None:
        placements = spec.placements
    if len(placements) != mesh.ndim:
        msg = (f"redistribute: {len(placements)} placements for a {mesh.ndim}-d DeviceMesh; "
               "give one per mesh dim")
        raise ValueError(msg)
    out = []
    for i, p in enumerate(placements):
        if isinstance(p, Shard) and not 0 <= p.dim < len(spec.shape):
            msg = f"redistribute: {p} on a {len(spec.shape)}-d tensor"
            raise ValueError(msg)
        if not isinstance(p, SHARDED):
            if want[i] is not None:
                msg = f"redistribute: sizes given for mesh dim {i}, which becomes {p}, not Shard"
                raise ValueError(msg)
            out.append(None)
            continue
        n = mesh.size(i)
        total = spec.shape[p.dim] if isinstance(p, Shard) else None
        w = want[i]
        if w is None:
            cur = spec.placements[i]
            same = isinstance(cur, Shard) and cur.dim == p.dim
            w = spec.sizes[i] if same else tuple(even_sizes(total, n))
        if len(w) != n or min(w) < 0 or (total is not None and sum(w) != total):
            msg = (
                f"redistribute: target sizes {tuple(w)} for mesh dim {i} must have {n} "
                f"non-negative entries summing to {total} (tensor dim {p.dim})"
            )
            raise ValueError(msg)
        out.append(tuple(w))
    return tuple(placements), tuple(out)


def _move_rows(t: torch.Tensor, dim: int, src: tuple, dst: tuple, mesh, i: int) -> torch.Tensor:
    """Rows of ``dim`` re-split from ``src`` to ``dst`` sizes: one uneven all-to-all moving only
    rows that change owner."""
    me = _coord(mesh)[1][i]
    so = [0]
    do = [0]
    for a, b in zip(src, dst):
        so.append(so[-1] + a)
        do.append(do[-1] + b)
    n = len(src)
    send = [max(0, min(so[me + 1], do[q + 1]) - max(so[me], do[q])) for q in range(n)]
    recv = [max(0, min(do[me + 1], so[q + 1]) - max(do[me], so[q])) for q in range(n)]
    x = t.movedim(dim, 0).contiguous()
    check("all_to_all", mesh, i, x, "re-split rows", varying_dim=0)
    y = _fc.wait_tensor(_fc.all_to_all_single(x, recv, send, _coord(mesh)[2][i]))
    return y.movedim(0, dim)


def redistribute_local(local: torch.Tensor, spec: ASpec, placements: tuple,
                       sizes: tuple) -> torch.Tensor:
    """This rank's piece of ``spec``'s tensor in the layout ``(placements, sizes)`` (validated
    by :func:`_target`). Not differentiable by itself; see :func:`redistribute`."""
    mesh = spec.mesh
    cur_p, cur_s = list(spec.placements), list(spec.sizes)
    for i in range(mesh.ndim):  # pass 1: leave Partial / Shard (reduce, move, gather)
        src, dst = cur_p[i], placements[i]
        if isinstance(src, Partial):
            if isinstance(dst, Partial):
                continue
            local = _all_reduce(local, mesh, i)
            cur_p[i], cur_s[i] = Replicate(), None
        elif isinstance(src, SHARDED):
            blocks = getattr(src, "blocks", 1)
            if blocks == 1 and isinstance(dst, Shard) and dst.dim == src.dim:
                if tuple(cur_s[i]) != tuple(sizes[i]) and mesh.size(i) > 1:
                    local = _move_rows(local, src.dim, cur_s[i], sizes[i], mesh, i)
                cur_p[i], cur_s[i] = dst, sizes[i]
                continue
            local = _all_gather_v(local, src.dim, cur_s[i], mesh, i, blocks)
            cur_p[i], cur_s[i] = Replicate(), None
    coord = _coord(mesh)[1]
    for i in range(mesh.ndim):  # pass 2: Replicate -> Shard (cut) / Partial (coordinate 0)
        src, dst = cur_p[i], placements[i]
        if src == dst or not isinstance(src, Replicate):
            continue
        if isinstance(dst, SHARDED):  # Blocked targets: gradients of flattened layouts
            local = _narrow(local, dst.dim, sizes[i], coord[i], getattr(dst, "blocks", 1))
        elif isinstance(dst, Partial) and coord[i] != 0:
            local = torch.zeros_like(local)
    return local


# The layout change is an aten-level custom op (not an autograd.Function reading the spec in
# Python), so dynamo records it as one graph node and the sharding rule below runs while
# AOTAutograd traces: redistribute works inside ``torch.compile`` without a graph break.
# A layout is encoded per mesh dim: kind (0 Replicate, 1 Shard, 2 Partial sum, 3 Blocked), the
# tensor dim, the blocks, and the per-rank sizes of sharded dims (flat, mesh-dim order).
_KIND = {Replicate: 0, Shard: 1, Partial: 2}


def _encode(placements: tuple | None, sizes: Any) -> tuple[list, list, list, list, list]:
    """Placements (None: keep) and sizes (None, a flat list for the one Shard placement, or
    one entry per mesh dim) as the op's lists; ``counts[i]`` = len of mesh dim i's sizes, -1
    when not given; ``[-2]`` = a flat list for the only Shard dim."""
    kinds, dims, blocks, flat, counts = [], [], [], [], []
    for p in placements or ():
        if isinstance(p, Partial) and p.reduce_op != "sum":
            msg = f"redistribute: Partial('{p.reduce_op}') is not supported; use Partial('sum')"
            raise NotImplementedError(msg)
        if not isinstance(p, (Replicate, Partial, *SHARDED)):
            msg = f"redistribute: placements must be Shard/Replicate/Partial, got {p!r}"
            raise TypeError(msg)
        kinds.append(3 if isinstance(p, SHARDED) and not isinstance(p, Shard) else _KIND[type(p)])
        dims.append(getattr(p, "dim", -1))
        blocks.append(getattr(p, "blocks", 1))
    if sizes is not None:
        seq = list(sizes)
        if seq and all(isinstance(v, int) for v in seq):
            flat, counts = [int(v) for v in seq], [-2]
        else:
            for sz in seq:
                counts.append(-1 if sz is None else len(sz))
                flat.extend(int(v) if isinstance(v, int) else v for v in sz or ())
    return kinds, dims, blocks, flat, counts


def _decode(spec: ASpec, kinds, dims, blocks, flat, counts) -> tuple[tuple | None, list]:
    mesh = spec.mesh
    placements = None
    if kinds:
        placements = tuple(
            Replicate() if kd == 0 else Partial() if kd == 2 else
            Shard(d) if kd == 1 else Blocked(d, b) for kd, d, b in zip(kinds, dims, blocks))
    want: list = [None] * mesh.ndim
    if list(counts) == [-2]:
        shard = [i for i, p in enumerate(placements or spec.placements) if isinstance(p, Shard)]
        if len(shard) != 1:
            msg = "redistribute: flat sizes need exactly one Shard placement; give one entry "\
                  "per mesh dim"
            raise ValueError(msg)
        want[shard[0]] = tuple(flat)
    elif counts:
        if len(counts) != mesh.ndim:
            msg = f"redistribute: sizes needs one entry per mesh dim ({mesh.ndim}), got "\
                  f"{len(counts)}"
            raise ValueError(msg)
        k = 0
        for i, c in enumerate(counts):
            if c >= 0:
                want[i] = tuple(flat[k : k + c])
                k += c
    return placements, want


@torch.library.custom_op("meshshard::redistribute", mutates_args=())
def _redistribute_op(x: torch.Tensor, kinds: list[int], dims: list[int], blocks: list[int],
                     sizes: list[int], counts: list[int]) -> torch.Tensor:
    msg = "meshshard::redistribute takes a ShardTensor (it is the layout change of one)"
    raise TypeError(msg)


@_redistribute_op.register_fake
def _(x, kinds, dims, blocks, sizes, counts):
    return torch.empty_like(x)


def _redistribute_setup(ctx, inputs, output) -> None:
    ctx.spec = inputs[0]._spec if isinstance(inputs[0], ShardTensor) else None


def _redistribute_backward(ctx, g):
    return grad_in_layout(g, ctx.spec), None, None, None, None, None


_redistribute_op.register_autograd(_redistribute_backward, setup_context=_redistribute_setup)


def _redistribute_rule(func, args, kwargs) -> ShardTensor:
    x, *enc = args
    spec = x._spec
    placements, sizes = _target(spec, *_decode(spec, *enc))
    if placements == spec.placements and sizes == spec.sizes:
        return ShardTensor(x._local.view_as(x._local), spec)
    local = redistribute_local(x._local, spec, placements, sizes)
    return ShardTensor(local, make_spec(spec.mesh, placements, sizes, spec.shape))


register_rule(torch.ops.meshshard.redistribute.default, direct=True)(_redistribute_rule)


def _relayout(x: ShardTensor, placements: tuple, sizes: tuple) -> ShardTensor:
    return torch.ops.meshshard.redistribute(x, *_encode(placements, list(sizes)))


def grad_in_layout(g: Any, spec: ASpec) -> Any:
    """A gradient ``g`` (arrived in any layout) in the layout of a tensor of ``spec``:
    differentiably, so double backward flows through. A Partial input's terms each get the
    whole gradient, so Partial dims become Replicate."""
    if not isinstance(g, ShardTensor) or spec is None:
        return g
    back = tuple(Replicate() if isinstance(p, Partial) else p for p in spec.placements)
    if g._spec.placements == back and g._spec.sizes == spec.sizes:
        return g
    return _relayout(g, back, spec.sizes)


def redistribute(x: ShardTensor, placements: Sequence[Any] | None = None,
                 sizes: Any = None) -> ShardTensor:
    """``x`` in another layout: Shard <-> Replicate <-> Partial('sum'), or a Shard dim with
    new uneven sizes (``sizes``: per mesh dim, or a flat list with one Shard placement; ``None``
    keeps the current sizes of an unchanged Shard dim and splits evenly otherwise).
    Differentiable to any order; collective over the mesh dims that change; traceable by
    ``torch.compile`` (one graph node)."""
    if not isinstance(x, ShardTensor):
        msg = f"redistribute needs a ShardTensor, got {type(x).__name__}"
        raise TypeError(msg)
    return torch.ops.meshshard.redistribute(
        x, *_encode(None if placements is None else tuple(placements), sizes))


LATE.update(redistribute=redistribute, grad_in_layout=grad_in_layout)
