"""Pieces of :class:`meshshard.ops.domino_ops.ShardedDominoOps`: the split of one kNN into
the ball queries of several radii, and the grid halo along one axis (its autograd Function)."""

from __future__ import annotations

import torch
import torch.nn.functional as tF
from torch.autograd.function import once_differentiable

from meshshard.shardtensor._aten.grid_halo import exchange_plan, fetch, fetch_transpose

__all__ = ["_halo_rows", "_split_radii"]


def _split_radii(d: torch.Tensor, idx: torch.Tensor, radii, ks):
    """(union, [index_i]) of :meth:`ShardedDominoOps.ball_queries` from the nearest
    ``kk <= max k`` (distances ``d``, indices ``idx``, sorted by distance, ties by index)."""
    kmax = max(ks)
    pad = kmax - idx.shape[1]
    union = tF.pad(torch.where(d <= max(radii), idx, -1), (0, pad), value=-1)
    each = []
    for r, k in zip(radii, ks):
        part = torch.where(d[:, :k] <= r, idx[:, :k], -1)
        each.append(tF.pad(part, (0, k - part.shape[1]), value=-1))
    return union, each


def _halo_rows(grid: torch.Tensor, dim: int, width: int, sizes, coord: int, mesh,
               mesh_dim: int) -> torch.Tensor:
    """``grid`` with ``width`` rows of spatial ``dim`` (1 = D, 2 = H) added on both sides from
    the ranks along ``mesh_dim`` (which hold ``sizes`` rows each; several ranks deep when they
    are thin); rows beyond the domain: zeros. The plan (who sends which rows) is a pure
    function of the sizes, so nothing is read back: one all-to-all forward, one backward."""
    sizes = tuple(int(v) for v in sizes)
    total = sum(sizes)
    needs = []
    for r in range(len(sizes)):
        row0 = sum(sizes[:r])
        needs.append(tuple(i if 0 <= i < total else -1
                           for i in range(row0 - width, row0 + sizes[r] + width)))
    ex = exchange_plan(dim, mesh_dim, sizes, tuple(needs), int(coord))
    return _Halo.apply(grid, ex, mesh)


class _Halo(torch.autograd.Function):
    """The window of a halo plan (:func:`~meshshard.shardtensor._aten.grid_halo.fetch`);
    backward: its adjoint (gradients of received rows summed into their owners). Collective
    forward and backward (when any rank needs another's rows)."""

    @staticmethod
    def forward(ctx, x, ex, mesh):
        ctx.ex, ctx.mesh, ctx.shape = ex, mesh, tuple(x.shape)
        return fetch(x.contiguous(), ex, mesh, 0.0, detail="DoMINO halo")

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        return fetch_transpose(g.contiguous(), ctx.ex, ctx.shape, ctx.mesh), None, None
