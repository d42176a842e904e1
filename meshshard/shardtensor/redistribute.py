"""Layout changes between Shard (any uneven sizes), Replicate and Partial. All collective and
differentiable."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.shardtensor import collectives as C
from meshshard.shardtensor.spec import ShardSpec, even_sizes, mesh_group, normalize_placements

__all__ = ["move_rows", "rebalance_counts", "redistribute", "redistribute_local"]


def rebalance_counts(
    src_sizes: Sequence[int], dst_sizes: Sequence[int], me: int
) -> tuple[list[int], list[int]]:
    """Rows this rank sends to / receives from each rank to go from ``src_sizes`` to
    ``dst_sizes`` (both contiguous layouts of the same rows in rank order)."""
    so = np.concatenate([[0], np.cumsum(src_sizes)])
    do = np.concatenate([[0], np.cumsum(dst_sizes)])
    n = len(src_sizes)
    send = [max(0, min(so[me + 1], do[q + 1]) - max(so[me], do[q])) for q in range(n)]
    recv = [max(0, min(do[me + 1], so[q + 1]) - max(do[me], so[q])) for q in range(n)]
    return [int(v) for v in send], [int(v) for v in recv]


def move_rows(
    x: torch.Tensor, dim: int, src_sizes: Sequence[int], dst_sizes: Sequence[int], group, me: int
) -> torch.Tensor:
    """Re-split rows along ``dim`` from ``src_sizes`` to ``dst_sizes`` moving only rows that
    change owner (uneven all-to-all). Differentiable; collective."""
    if tuple(src_sizes) == tuple(dst_sizes):
        return x
    send, recv = rebalance_counts(src_sizes, dst_sizes, me)
    y = C.all_to_all_v(x.movedim(dim, 0), send, recv, group)
    return y.movedim(0, dim)


def _norm_target_sizes(sizes: Any, placements: tuple, mesh) -> list:
    if sizes is None:
        return [None] * mesh.ndim
    seq = list(sizes)
    if seq and all(isinstance(v, int) for v in seq):
        shard = [i for i, p in enumerate(placements) if isinstance(p, Shard)]
        if len(shard) != 1:
            msg = "flat sizes need exactly one Shard placement; give one entry per mesh dim"
            raise ValueError(msg)
        out: list = [None] * mesh.ndim
        out[shard[0]] = tuple(seq)
        return out
    if len(seq) != mesh.ndim:
        msg = f"sizes needs one entry per mesh dim ({mesh.ndim}), got {len(seq)}"
        raise ValueError(msg)
    return [None if s is None else tuple(int(v) for v in s) for s in seq]


def redistribute_local(
    local: torch.Tensor,
    spec: ShardSpec,
    placements: Sequence[Any],
    sizes: Any = None,
) -> torch.Tensor:
    """Local piece of ``spec``'s tensor in the target layout (see :func:`redistribute`)."""
    return _redistribute(local, spec, placements, sizes)[0]


def _redistribute(local, spec: ShardSpec, placements, sizes=None):
    mesh = spec.mesh
    placements = normalize_placements(placements, mesh, spec.ndim)
    target_sizes = _norm_target_sizes(sizes, placements, mesh)
    coord = spec.coordinate()
    cur_p = list(spec.placements)
    cur_s = list(spec.sizes)
    # pass 1: everything that leaves Partial or Shard -> Replicate/other (gathers & reductions)
    for i in range(mesh.ndim):
        src, dst = cur_p[i], placements[i]
        group = mesh_group(mesh, i)
        if src == dst and not isinstance(src, Shard):
            continue
        if isinstance(src, Partial):
            local = C.all_reduce(local, src.reduce_op, group)
            cur_p[i], cur_s[i] = Replicate(), None
        elif isinstance(src, Shard):
            want = target_sizes[i]
            if isinstance(dst, Shard) and dst.dim == src.dim:
                want = want if want is not None else cur_s[i]
                if len(want) != mesh.size(i) or sum(want) != sum(cur_s[i]) or min(want) < 0:
                    msg = (
                        f"target sizes {want} for mesh dim {i} must have {mesh.size(i)} "
                        f"non-negative entries summing to {sum(cur_s[i])}"
                    )
                    raise ValueError(msg)
                local = move_rows(local, src.dim, cur_s[i], want, group, coord[i])
                cur_s[i] = tuple(want)
                continue
            local = C.all_gather_v(local, src.dim, cur_s[i], group)
            cur_p[i], cur_s[i] = Replicate(), None
    # pass 2: Replicate -> Shard / Partial
    shape = spec.shape
    for i in range(mesh.ndim):
        src, dst = cur_p[i], placements[i]
        if src == dst:
            continue
        group = mesh_group(mesh, i)
        if isinstance(dst, Shard):
            want = target_sizes[i]
            if want is None:
                want = even_sizes(shape[dst.dim], mesh.size(i))
            if len(want) != mesh.size(i) or sum(want) != shape[dst.dim] or min(want) < 0:
                msg = (
                    f"target sizes {want} for mesh dim {i} must have {mesh.size(i)} non-negative "
                    f"entries summing to {shape[dst.dim]}"
                )
                raise ValueError(msg)
            local = C.split_local(local, dst.dim, want, group)
            cur_p[i], cur_s[i] = dst, tuple(want)
        elif isinstance(dst, Partial):
            if dst.reduce_op in ("max", "min"):
                keep = local
            else:
                local = C.grad_all_reduce(local, [group])
                keep = local if coord[i] == 0 else local * 0
                if dst.reduce_op == "avg":
                    keep = local
            local = keep
            cur_p[i], cur_s[i] = dst, None
    new_spec = ShardSpec.make(mesh, tuple(cur_p), shape, cur_s)
    return local, new_spec


def redistribute(st, placements=None, sizes=None):
    """Return ``st`` in a new layout. ``placements=None`` keeps the current ones (use it with
    ``sizes`` to rebalance). Differentiable; collective."""
    from meshshard.shardtensor.api import ShardTensor

    if placements is None:
        placements = st._spec.placements
    local, spec = _redistribute(st._local, st._spec, placements, sizes)
    return ShardTensor(local, spec)
