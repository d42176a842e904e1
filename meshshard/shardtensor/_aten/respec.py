"""Operands of one op that shard the same dim on the same mesh dim with different per-rank
sizes (``x[:, 1:-1] * y[:, 2:]``: slices shift the boundaries differently): the later operand
is respecced to the first's sizes before the op, as design A did. Only the rows that change
owner move (one uneven all-to-all per such mesh dim, :func:`..rules.respec_local`); the step
is a layout conversion of the local piece inside the op's rule, so autograd differentiates the
op alone and the backward (the same rule on the gradients) moves the rows back.

Where the layouts cannot be reconciled this way (another dim sharded on that mesh dim, a
``Blocked`` against a ``Shard``, different extents, different meshes) the error says so.

This module holds only the layout arithmetic; the pointwise rule calls it. It imports only
``tensor.py`` and ``meshshard.errors``, so ``dispatch.py`` may import it.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import Replicate

from meshshard.errors import LayoutError
from meshshard.shardtensor._aten.tensor import ShardTensor, make_spec

_REP = Replicate()


def check_same_mesh(func: Any, args: tuple, mesh) -> None:
    """Every ShardTensor operand lives on ``mesh``; else a :class:`LayoutError`."""
    for a in args:
        if type(a) is ShardTensor and a._spec.mesh is not mesh and a._spec.mesh != mesh:
            msg = (
                f"{func}: ShardTensors live on different DeviceMeshes ({mesh} and "
                f"{a._spec.mesh}); build both on the same mesh, or move one with "
                "from_local(t.full_tensor(), mesh, ...)"
            )
            raise LayoutError(msg)


def resize_step(func: Any, spec, i: int, dim: int, sizes: tuple, target: tuple) -> tuple:
    """The step that brings an operand's rows along ``dim`` (sharded by mesh dim ``i`` with
    per-rank ``sizes``) to the per-rank ``target`` sizes; the other mesh dims are untouched.

    Both ends are written with Replicate on every other mesh dim, so the conversion moves
    rows over mesh dim ``i`` alone (the ranks of that group hold the same extent of every other
    dim), whatever the operand's other placements (a Partial kept as Partial stays unreduced).
    """
    total, want = sum(sizes), sum(target)
    if type(total) is int and type(want) is int and total != want:
        msg = (f"{func}: operands shard dim {dim} on mesh dim {i} with different extents "
               f"({total} and {want})")
        raise LayoutError(msg)
    p = spec.placements[i]
    pl = tuple(p if j == i else _REP for j in range(len(spec.placements)))
    none = [None] * len(pl)
    src_sizes, dst_sizes = list(none), list(none)
    src_sizes[i], dst_sizes[i] = tuple(sizes), tuple(target)
    src = make_spec(spec.mesh, pl, tuple(src_sizes), tuple(spec.shape))
    dst = make_spec(spec.mesh, pl, tuple(dst_sizes), tuple(spec.shape))
    return ("respec", src, dst)


def mismatch(func: Any, i: int, first: tuple, other: tuple) -> LayoutError:
    """The error for operands that shard different dims (or in different ways) on mesh dim
    ``i``. ``first``/``other``: (output dim, placement, sizes)."""
    (d0, p0, s0), (d1, p1, s1) = first, other
    msg = (
        f"{func}: operands are sharded differently on mesh dim {i} (output dim {d0} as {p0} "
        f"sizes {list(s0)} vs output dim {d1} as {p1} sizes {list(s1)}); redistribute one "
        "first, e.g. b = b.redistribute(a.placements, sizes=...)"
    )
    return LayoutError(msg)
