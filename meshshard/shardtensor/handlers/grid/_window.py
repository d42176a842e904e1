"""Shared machinery of the grid rules: which dims are sharded, who owns which output, which
input rows each rank needs, and the output layout.

Ownership rule (stated once, used by every grid rule): output index ``j`` along a sharded dim
belongs to the rank that owns its *anchor* input row, clamped to ``[0, N - 1]``:

- conv / pool: the centre of the receptive field, ``j*stride - pad_left + dilation*(k-1)//2``
  (a stride-1 "same" conv keeps the layout; a stride-2 conv or pool with kernel 2 or 3 gives
  output ``j`` to the owner of input ``2j``; a patch embedding gives each patch to the owner of
  its centre row). Strides are aligned to the global index.
- conv_transpose: ``(j + pad) // stride`` (the input whose stride block holds ``j``).
- F.pad: ``j - pad_left``; interpolate: the lower source row.

Anchors are monotone in ``j``, so every rank gets one contiguous run of outputs (possibly
empty); the resulting sizes are recorded in the output's ShardSpec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.distributed.tensor import Shard

from meshshard.shardtensor._layout import LayoutError
from meshshard.shardtensor.handlers.grid.halo import fetch_rows, owner_of
from meshshard.shardtensor.spec import ShardSpec


@dataclass(frozen=True)
class DimPlan:
    """One sharded spatial dim: output sizes per rank and every rank's needed input rows."""

    dim: int
    mesh_dim: int
    out_sizes: tuple
    needs: tuple
    periodic: bool = False


def sharded_spatial(spec: ShardSpec, n_spatial: int, op: str) -> dict[int, int]:
    """tensor dim -> mesh dim of the sharded spatial dims of a (N, C, *spatial) or
    (C, *spatial) tensor; batch sharding is allowed, channel sharding raises."""
    nd = spec.ndim
    first = nd - n_spatial
    out = {}
    for i, p in enumerate(spec.placements):
        if not isinstance(p, Shard):
            continue
        if p.dim == first - 1:
            msg = (
                f"{op}: the input is sharded along its channel dim {p.dim}; grid rules shard "
                "spatial dims (and the batch dim). Redistribute the channels to Replicate and "
                "shard a spatial dim instead"
            )
            raise LayoutError(msg)
        if p.dim >= first:
            out[p.dim] = i
    return out


def out_sizes_of(anchors: np.ndarray, sizes: Sequence[int]) -> tuple:
    """Sizes per rank from each output's anchor input row (already clamped)."""
    own = owner_of(anchors, sizes) if anchors.size else np.zeros(0, dtype=np.int64)
    return tuple(int(v) for v in np.bincount(own, minlength=len(sizes)))


def ranges_of(out_sizes: Sequence[int]) -> list[tuple[int, int]]:
    offs = np.concatenate([[0], np.cumsum(out_sizes)]).astype(int)
    return [(int(offs[r]), int(offs[r + 1])) for r in range(len(out_sizes))]


def sliding_plan(
    dim: int, mesh_dim: int, sizes: Sequence[int], m: int, k: int, s: int, dl: int, pl: int
) -> DimPlan:
    """Plan for a sliding window (conv/pool) of ``m`` outputs over ``N = sum(sizes)`` rows:
    rank r's window covers every input its outputs read; rows outside ``[0, N)`` are fill."""
    n = int(sum(sizes))
    if n == 0:
        msg = f"grid rule: the sharded dim {dim} has global size 0"
        raise ValueError(msg)
    j = np.arange(m, dtype=np.int64)
    anchors = np.clip(j * s - pl + (dl * (k - 1)) // 2, 0, n - 1)
    out_sizes = out_sizes_of(anchors, sizes)
    needs = []
    for j0, j1 in ranges_of(out_sizes):
        if j1 == j0:
            needs.append(())
            continue
        t = np.arange(j0 * s - pl, (j1 - 1) * s - pl + dl * (k - 1) + 1, dtype=np.int64)
        t[(t < 0) | (t >= n)] = -1
        needs.append(tuple(t.tolist()))
    return DimPlan(dim, mesh_dim, out_sizes, tuple(needs))


def gather_windows(
    local: torch.Tensor, spec: ShardSpec, plans: Sequence[DimPlan], fill: float = 0.0
) -> torch.Tensor:
    """Apply every plan in turn (so corners of 2-D splits arrive with the second exchange).
    Collective over each plan's mesh dim."""
    mesh = spec.mesh
    sizes = list(spec.sizes)
    for p in plans:
        local = fetch_rows(
            local,
            p.dim,
            sizes[p.mesh_dim],
            p.needs,
            mesh.get_group(p.mesh_dim),
            mesh.get_local_rank(p.mesh_dim),
            fill=fill,
            periodic=p.periodic,
        )
    return local


def out_spec(spec: ShardSpec, shape: Sequence[int], plans: Sequence[DimPlan]) -> ShardSpec:
    sizes = list(spec.sizes)
    for p in plans:
        sizes[p.mesh_dim] = p.out_sizes
    return ShardSpec(spec.mesh, spec.placements, tuple(sizes), torch.Size(shape))


def empty_like_out(
    shape: Sequence[int], like: torch.Tensor, deps: Sequence[torch.Tensor | None]
) -> torch.Tensor:
    """A zero-size local output that still depends on ``deps``: every rank then runs the same
    backward collectives (halo exchange, weight-gradient all-reduce), so none is left waiting."""
    out = like.new_zeros(tuple(shape))
    z = None
    for t in deps:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            term = t.sum() * 0
            z = term if z is None else z + term
    return out if z is None else out + z


def tuple_arg(v, n: int, name: str) -> tuple:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(a) for a in v)
    if len(v) == 1:
        return v * n
    if len(v) != n:
        msg = f"{name}={v} must have 1 or {n} entries"
        raise ValueError(msg)
    return v
