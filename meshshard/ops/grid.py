"""Point cloud <-> sharded grid: trilinear (bi-/linear in 2-D/1-D) splatting of point features
onto a grid sharded in slabs, and interpolation of grid values back at the points.

Points are sharded by any partition (rows of a ``(N, k)`` ShardTensor), the grid ``(C, *S)``
along any one spatial dim, both on the same 1-D mesh. A point's cell has two corner rows along the
sharded dim; each point is sent only to the owners of those rows (one rank, or two when the
cell straddles a cut), which add or read the corners they own. Two uneven all-to-alls, nothing
else moves. Differentiable with respect to the grid, the point values and the coordinates
(the trilinear weights), like the single-process trilinear ``grid_sample`` / its adjoint.

Coordinates are physical: index coordinate ``u = (p - origin) / spacing`` along each spatial
dim (the first column is the first spatial dim), clamped to ``[0, S - 1]`` (border).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.distributed.tensor import Shard

from meshshard.comm.rows import all_to_all, exchange_counts
from meshshard.ops.gridsample import _GradSum
from meshshard.shardtensor import ShardTensor, from_local

__all__ = ["grid_gather", "grid_scatter"]


def _index_coords(points: torch.Tensor, shape: Sequence[int], origin, spacing) -> torch.Tensor:
    u = (points - torch.as_tensor(origin, dtype=points.dtype, device=points.device)) / (
        torch.as_tensor(spacing, dtype=points.dtype, device=points.device))
    hi = torch.as_tensor([s - 1 for s in shape], dtype=points.dtype, device=points.device)
    return torch.minimum(torch.clamp(u, min=0), hi)


def _cell(u: torch.Tensor, shape: Sequence[int]):
    """Lower corner (int64) and fractions of every point's cell."""
    lo = torch.floor(u.detach()).long()
    top = torch.as_tensor([max(s - 2, 0) for s in shape], device=u.device)
    lo = torch.minimum(lo, top)
    return lo, u - lo.to(u.dtype)


def _corners(u, shape, row0: int, rows: int, axis: int):
    """For every point and each of the 2^k cell corners whose row along spatial ``axis`` lies
    in ``[row0, row0 + rows)``: flat local index and trilinear weight (0 where not owned)."""
    k = len(shape)
    lo, frac = _cell(u, shape)
    local_shape = list(shape)
    local_shape[axis] = rows
    strides = np.cumprod([1, *local_shape[::-1]])[:-1][::-1].tolist()
    out = []
    for bits in range(2**k):
        b = [(bits >> j) & 1 for j in range(k)]
        idx = lo + torch.as_tensor(b, device=u.device)
        idx = torch.minimum(idx, torch.as_tensor([s - 1 for s in shape], device=u.device))
        wgt = None
        for j in range(k):
            f = frac[:, j] if b[j] else 1 - frac[:, j]
            wgt = f if wgt is None else wgt * f
        r = idx[:, axis] - row0
        own = (r >= 0) & (r < rows)
        flat = r.clamp(0, max(rows - 1, 0)) * strides[axis]
        for j in range(k):
            if j != axis:
                flat = flat + idx[:, j] * strides[j]
        out.append((flat, wgt * own.to(wgt.dtype)))
    return out


def _local_gather(grid_local, u, shape, row0, axis=0):
    c = grid_local.shape[0]
    rows = grid_local.shape[1 + axis]
    flat_grid = grid_local.reshape(c, -1)
    acc = u.new_zeros((u.shape[0], c)) + 0 * u.sum()
    if flat_grid.shape[1] == 0:
        return acc
    for flat, wgt in _corners(u, shape, row0, rows, axis):
        acc = acc + flat_grid.index_select(1, flat).T * wgt[:, None]
    return acc


def _local_scatter(values, u, shape, row0, rows, axis=0):
    c = values.shape[1]
    local_shape = list(shape)
    local_shape[axis] = rows
    n_cells = int(np.prod(local_shape, dtype=np.int64))
    out = values.new_zeros((c, n_cells)) + 0 * (u.sum() + values.sum())
    if n_cells == 0:
        return out.reshape(c, *local_shape)
    for flat, wgt in _corners(u, shape, row0, rows, axis):
        out = out.index_add(1, flat, (values * wgt[:, None]).T)
    return out.reshape(c, *local_shape)


def _route(u, shape, sizes, axis):
    """Destinations of every point: (order, send_counts, n_first) with the point list
    [all points -> owner of the lower row] + [straddling points -> owner of the upper row]."""
    lo, _ = _cell(u, shape)
    ends = torch.as_tensor(np.cumsum(sizes), device=u.device)
    r0 = lo[:, axis].contiguous()
    r1 = torch.clamp(r0 + 1, max=shape[axis] - 1).contiguous()
    o0 = torch.searchsorted(ends, r0, right=True)
    o1 = torch.searchsorted(ends, r1, right=True)
    two = torch.nonzero(o1 != o0).flatten()
    pid = torch.cat([torch.arange(u.shape[0], device=u.device), two])
    dest = torch.cat([o0, o1[two]])
    order = torch.argsort(dest, stable=True)
    counts = torch.bincount(dest, minlength=len(sizes)).tolist()
    return pid[order], order, counts


def _check(points, grid_dims, mesh, op):
    if not isinstance(points, ShardTensor):
        msg = f"{op}: points must be a ShardTensor sharded along dim 0"
        raise TypeError(msg)
    pmesh = points.device_mesh
    if pmesh.ndim != 1 or tuple(points.placements) != (Shard(0),):
        msg = (f"{op}: points must be Shard(0) on a 1-D mesh, got placements "
               f"{tuple(points.placements)} on a {pmesh.ndim}-d mesh")
        raise ValueError(msg)
    if mesh is not None and mesh is not pmesh and mesh != pmesh:
        msg = f"{op}: the grid and the points live on different DeviceMeshes"
        raise ValueError(msg)
    if points.shape[-1] != grid_dims:
        msg = f"{op}: points have {points.shape[-1]} coordinates but the grid {grid_dims} dims"
        raise ValueError(msg)


def grid_gather(
    grid: ShardTensor, points: ShardTensor, *, origin=0.0, spacing=1.0
) -> ShardTensor:
    """Trilinear interpolation of ``grid`` (C, *S) at ``points`` (N, k) -> (N, C).

    ``grid`` is sharded along one spatial dim (or replicated); the result is sharded like
    ``points``. Collective: every rank of the mesh must call this.
    """
    if not isinstance(grid, ShardTensor):
        msg = "grid_gather: the grid must be a ShardTensor (split along one spatial dim or "\
              "replicated)"
        raise TypeError(msg)
    shape = list(grid.shape[1:])
    mesh = grid.device_mesh
    _check(points, len(shape), mesh, "grid_gather")
    group = mesh.get_group(0)
    me = mesh.get_local_rank(0)
    placements = tuple(grid.placements)
    split = [p.dim for p in placements if isinstance(p, Shard)]
    if len(split) > 1 or (split and split[0] == 0) or len(split) != sum(
            not p.is_replicate() for p in placements):
        msg = (f"grid_gather: the grid (C, *S) must be split along one spatial dim or "
               f"replicated, got placements {placements}")
        raise ValueError(msg)
    u = _index_coords(points.to_local(), shape, origin, spacing)
    gl = grid.to_local()
    if not split:  # replicated grid: purely local reads; the gradient is summed over ranks
        if gl.requires_grad:
            gl = _GradSum.apply(gl, group)
        out = _local_gather(gl, u, shape, 0, 0)
    else:
        axis = split[0] - 1
        sizes = grid.sharding_sizes(0)
        pid, _, send_counts = _route(u, shape, sizes, axis)
        recv_counts = exchange_counts(send_counts, group, u.device)
        ru = all_to_all(u.index_select(0, pid), send_counts, recv_counts, group)
        part = _local_gather(gl, ru, shape, int(sum(sizes[:me])), axis)
        back = all_to_all(part, recv_counts, send_counts, group)
        out = u.new_zeros((u.shape[0], gl.shape[0])).index_add(0, pid, back)
    sizes = list(points.sharding_sizes(0))
    return from_local(out, mesh, [Shard(0)], sharding_shapes={0: sizes}, validate=False)


def grid_scatter(
    points: ShardTensor,
    values: ShardTensor,
    shape: Sequence[int],
    sizes: Sequence[int],
    *,
    origin=0.0,
    spacing=1.0,
    axis: int = 0,
) -> ShardTensor:
    """Trilinear splatting of ``values`` (N, C) at ``points`` (N, k) onto a grid
    (C, *shape) sharded along spatial dim ``axis`` (tensor dim ``axis + 1``) with ``sizes``
    rows per rank.

    The adjoint of :func:`grid_gather`. Collective: every rank of the mesh must call this.
    """
    shape = [int(s) for s in shape]
    _check(points, len(shape), None, "grid_scatter")
    mesh = points.device_mesh
    if (not isinstance(values, ShardTensor) or tuple(values.placements) != (Shard(0),)
            or values.device_mesh != mesh
            or values.sharding_sizes(0) != points.sharding_sizes(0)):
        msg = "grid_scatter: values must be a ShardTensor sharded exactly like points"
        raise ValueError(msg)
    sizes = tuple(int(s) for s in sizes)
    if not 0 <= axis < len(shape):
        msg = f"grid_scatter: axis={axis} must name one of the {len(shape)} spatial dims"
        raise ValueError(msg)
    if len(sizes) != mesh.size(0) or sum(sizes) != shape[axis]:
        msg = (f"grid_scatter: sizes {sizes} must give one entry per rank summing to "
               f"{shape[axis]}")
        raise ValueError(msg)
    group = mesh.get_group(0)
    me = mesh.get_local_rank(0)
    u = _index_coords(points.to_local(), shape, origin, spacing)
    vals = values.to_local()
    pid, _, send_counts = _route(u, shape, sizes, axis)
    recv_counts = exchange_counts(send_counts, group, u.device)
    payload = torch.cat([u.index_select(0, pid), vals.index_select(0, pid).to(u.dtype)], 1)
    recv = all_to_all(payload, send_counts, recv_counts, group)
    k = len(shape)
    out = _local_scatter(recv[:, k:].to(vals.dtype), recv[:, :k], shape, int(sum(sizes[:me])),
                         sizes[me], axis)
    return from_local(out, mesh, [Shard(axis + 1)], sharding_shapes={0: list(sizes)},
                      validate=False)
