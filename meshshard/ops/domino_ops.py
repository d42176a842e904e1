"""The domain-parallel ops behind :class:`meshshard.models.DoMINO` (its ``ops=`` hook).

The model is plain torch and calls six ops (``grid_nodes``, ``ball_query``, ``knn``,
``gather``, ``halo``, ``sample``); :class:`ShardedDominoOps` answers them on this rank's rows
with meshshard's exact distributed kernels: the STL points and the sampled points are sharded
(uneven, empty shards allowed), the latent grid is either replicated or cut in slabs along
``D`` (uneven, one-row and empty slabs allowed; halos reach across several ranks when a slab is
thinner than the conv).

Gradient convention: each rank's loss is its share of the global loss (its rows' sum divided
by the global count); after ``backward`` sum every parameter's gradient over the ranks (one
all-reduce, :func:`allreduce_grads`) to get one process's gradients.

Every method is collective over the group (forward and backward).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as tF

from meshshard.ops import functional as Fn
from meshshard.ops import halo as H
from meshshard.ops.gridpoint import GridLayout
from meshshard.ops.gridsample import grid_sample
from meshshard.shardtensor import Shard, from_local

__all__ = ["ShardedDominoOps", "allreduce_grads"]


class ShardedDominoOps:
    """DoMINO's ops on shards.

    Parameters
    ----------
    mesh : DeviceMesh
        1-D mesh of the ranks sharing one sample.
    grid_sizes : sequence of int, optional
        Rows of the latent grid's ``D`` per rank (sum ``D``; zeros allowed). ``None``: every rank
        holds the whole grid (replicated; no grid communication, redundant grid compute).
    backend : str
        Local neighbour kernel (see :mod:`meshshard.ops.kernels`).
    """

    def __init__(self, mesh, grid_sizes: Sequence[int] | None = None, *, backend: str = "auto"):
        self.mesh = mesh
        self.group = mesh.get_group(0)
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self.grid_sizes = None if grid_sizes is None else tuple(int(s) for s in grid_sizes)
        if self.grid_sizes is not None and len(self.grid_sizes) != self.world:
            msg = (f"ShardedDominoOps: grid_sizes has {len(self.grid_sizes)} entries for "
                   f"{self.world} ranks")
            raise ValueError(msg)
        self.backend = backend

    def layout(self, shape, origin, spacing) -> GridLayout:
        return GridLayout(shape, origin, spacing, sizes=self.grid_sizes, axis=0)

    def grid_nodes(self, shape, origin, spacing, dtype) -> torch.Tensor:
        return self.layout(shape, origin, spacing).local_nodes(self.rank, dtype)

    def ball_query(self, points, queries, r: float, k: int) -> torch.Tensor:
        """The nearest ``<= k`` points within ``r``: the ``k`` nearest, those beyond ``r``
        dropped. Equal to a capped radius query (ties by index alike), but the pruned kNN
        never enumerates every point in the ball (DoMINO's balls hold thousands)."""
        if not r > 0:
            msg = f"ball_query: r={r} must be > 0"
            raise ValueError(msg)
        n = torch.tensor([points.shape[0]], dtype=torch.int64)
        dist.all_reduce(n, group=self.group)
        kk = min(int(k), int(n))
        if kk == 0:
            return torch.full((queries.shape[0], k), -1, dtype=torch.int64)
        d, idx = Fn.knn(points.detach(), kk, queries.detach(), group=self.group,
                        backend=self.backend)
        idx = torch.where(d <= r, idx, -1)
        return tF.pad(idx, (0, k - kk), value=-1)

    def knn(self, points, k: int) -> torch.Tensor:
        _, idx = Fn.knn(points.detach(), k, group=self.group, backend=self.backend)
        return idx

    def gather(self, features, index) -> torch.Tensor:
        return H.gather_neighbors(features, index, group=self.group)

    def halo(self, grid, width: int) -> torch.Tensor:
        if self.grid_sizes is None:
            return tF.pad(grid, (0, 0, 0, 0, width, width))
        c, d, h, w = grid.shape
        row0 = sum(self.grid_sizes[: self.rank])
        rows = torch.arange(row0 - width, row0 + d + width, device=grid.device)
        rows = torch.where((rows >= 0) & (rows < sum(self.grid_sizes)), rows, -1)
        flat = grid.permute(1, 0, 2, 3).reshape(d, c * h * w)
        out = H.gather_neighbors(flat, rows, group=self.group, sizes=self.grid_sizes)
        return out.reshape(-1, c, h, w).permute(1, 0, 2, 3)

    def sample(self, grid, points, origin, spacing, shape) -> torch.Tensor:
        lay = GridLayout(shape, origin, spacing)
        c = lay.normalize(points, align_corners=True)
        if self.grid_sizes is None:  # whole grid here: purely local (partial gradients)
            return grid_sample(grid[None], c[None], align_corners=True,
                               padding_mode="border")[0]
        G = from_local(grid[None], self.mesh, [Shard(2)], [list(self.grid_sizes)],
                       validate=False)
        Cc = from_local(c[None], self.mesh, [Shard(1)], None)
        out = grid_sample(G, Cc, align_corners=True, padding_mode="border")
        return out.to_local()[0]

    def reduce_mean_count(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, group=self.group)
        return int(t)


def allreduce_grads(module: torch.nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Sum every parameter's gradient over ``group`` (missing gradients count as zero).

    Collective: every rank of ``group`` must call this with the same module structure.
    """
    for p in module.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=group)
