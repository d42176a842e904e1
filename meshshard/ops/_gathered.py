"""Static-shape neighbour search over a group: every rank's points gathered, then searched here.

The exact distributed kNN (:func:`meshshard.ops.knn`) forwards each query only to the ranks
that may hold a closer point and :func:`~meshshard.ops.gather_neighbors` fetches only the
referenced rows, each once: the sizes of those exchanges depend on the data, so they are read
back to the host (one sync each), and such a step cannot run on the meta device. Here the sizes
come from every rank's row count (a layout's, known without a read-back): the points are
all-gathered (padded to the largest shard) and searched locally, and a gather indexes the
all-gathered features. No read-back with a static-shape kernel (``backend="brute"``); the price
is ``O(N)`` memory and traffic per rank for the ``N`` points of the group, so it suits point
sets that fit every rank (DoMINO's STL surface and sampled points per sample).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from meshshard.comm.rows import all_gather_rows
from meshshard.ops import kernels

__all__ = ["gather_all", "gathered_knn", "gathered_rows"]


def _padded(x: torch.Tensor, width: int) -> torch.Tensor:
    if x.shape[0] == width:
        return x.contiguous()
    out = x.new_zeros((width, *x.shape[1:]))
    out[: x.shape[0]] = x
    return out


def _gather(x: torch.Tensor, sizes: list[int], group: Any) -> torch.Tensor:
    full = all_gather_rows(_padded(x, max(sizes)), group)  # (P, widest, ...)
    return torch.cat([full[r, :n] for r, n in enumerate(sizes)])


class _GatherAll(torch.autograd.Function):
    """Every rank's rows in rank order; backward: the gradients of this rank's rows summed over
    the ranks (one all-reduce). Collective forward and backward."""

    @staticmethod
    def forward(ctx, x, sizes, rank, group):  # type: ignore[override]
        ctx.meta = (sizes, rank, group, max(sizes))
        return _gather(x, sizes, group)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):  # type: ignore[override]
        sizes, rank, group, width = ctx.meta
        pad = g.new_zeros((len(sizes), width, *g.shape[1:]))
        at = 0
        for r, n in enumerate(sizes):
            pad[r, :n] = g[at : at + n]
            at += n
        dist.all_reduce(pad, group=group)
        return pad[rank, : sizes[rank]], None, None, None


def gathered_rows(x: torch.Tensor, sizes: Sequence[int], group: Any) -> torch.Tensor:
    """All ranks' rows of ``x`` (``sizes[r]`` on rank ``r``), in rank order. Differentiable
    (gradients summed at the owners). Collective; no host sync."""
    sizes = [int(n) for n in sizes]
    rank = dist.get_rank(group)
    if len(sizes) != dist.get_world_size(group) or sizes[rank] != x.shape[0]:
        msg = (f"gathered search: sizes {sizes} do not fit rank {rank} holding {x.shape[0]} "
               "rows; pass every rank's row count")
        raise ValueError(msg)
    if x.requires_grad and torch.is_grad_enabled():
        return _GatherAll.apply(x, sizes, rank, group)
    return _gather(x, sizes, group)


def gathered_knn(points: torch.Tensor, k: int, queries: torch.Tensor, sizes: Sequence[int],
                 group: Any, backend: str = "brute") -> tuple[torch.Tensor, torch.Tensor]:
    """``(dist, index)`` (m, k) of the ``k`` nearest of all ranks' ``points`` to this rank's
    ``queries``: distances ascending in ``points``' dtype, global indices (rank order), ties
    by the lower index, ``inf`` / ``-1`` past the group's point count (as
    :func:`meshshard.ops.knn`). Not differentiable (the indices are what the callers use).
    Collective; no host sync with ``backend="brute"``."""
    with torch.no_grad():
        everyone = gathered_rows(points.detach(), sizes, group)
        d2, idx = kernels.KnnIndex(everyone, backend=backend).query(queries.detach(), k)
    return d2.sqrt().to(points.dtype), idx


def gather_all(features: torch.Tensor, index: torch.Tensor, sizes: Sequence[int],
               group: Any) -> torch.Tensor:
    """Rows of the distributed ``features`` at global ``index`` (any shape; ``-1``: zeros),
    from all ranks' rows gathered here. Differentiable w.r.t. ``features`` on every rank.
    Collective; no host sync."""
    everyone = gathered_rows(features, sizes, group)
    pool = torch.cat([everyone, everyone.new_zeros((1, *everyone.shape[1:]))])
    flat = index.reshape(-1).to(device=pool.device, dtype=torch.int64)
    flat = torch.where((flat < 0) | (flat >= everyone.shape[0]), everyone.shape[0], flat)
    return pool[flat].reshape(*index.shape, *features.shape[1:])
