"""The model's inputs built with bounded temporaries: the exact distributed kNN streamed
``max_queries_per_chunk`` queries at a time (:func:`meshshard.ops.knn_chunks`), each chunk's
neighbour rows gathered and turned into features at once (every rank runs the same number of
rounds). Equal to :func:`meshshard.apps.train.build_inputs` (the same neighbours, the same
per-row arithmetic)."""

from __future__ import annotations

from typing import Any

import torch

from meshshard import ops
from meshshard.apps.train import features_from_neighbours
from meshshard.partition.distributed._mem import trim_heap

__all__ = ["chunked_inputs"]


_STEP = 1 << 16  # rows per step of the standardisation passes


def _global_mean_std(x: torch.Tensor, group: Any, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Column mean and unbiased std of the rows of all ranks (float64 sums, two passes,
    ``_STEP`` rows at a time), rounded to ``x``'s dtype as ``_standardise`` has them."""
    import torch.distributed as dist

    s = torch.zeros(x.shape[1], dtype=torch.float64)
    for a in range(0, x.shape[0], _STEP):
        s += x[a : a + _STEP].double().sum(0)
    dist.all_reduce(s, group=group)
    mean = s / max(total, 1)
    ss = torch.zeros_like(s)
    for a in range(0, x.shape[0], _STEP):
        ss += (x[a : a + _STEP].double() - mean).pow(2).sum(0)
    dist.all_reduce(ss, group=group)
    std = (ss / max(total - 1, 1)).sqrt()
    return mean.to(x.dtype), std.to(x.dtype)


def _standardise_into(out: torch.Tensor, x: torch.Tensor, group: Any, total: int) -> None:
    """``out[:] = (x - mean) / (std + 1e-6)`` with global statistics, step by step (``out``
    may be ``x``): no full-size temporaries."""
    mean, std = _global_mean_std(x, group, total)
    for a in range(0, x.shape[0], _STEP):
        out[a : a + _STEP] = (x[a : a + _STEP] - mean) / (std + 1e-6)


def chunked_inputs(coords: Any, normals: Any, *, knn: int, max_queries_per_chunk: int,
                   sizes: list[int], release: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (1, n, 3) coordinates and (1, n, 7) features, as ``build_inputs`` makes
    them, from ShardTensors ``coords``/``normals`` (N, 3) sharded with ``sizes``.

    Collective: every rank of the mesh must call this (kNN and two neighbour gathers per
    round, the global statistics). Working memory is bounded by ``max_queries_per_chunk``
    (:mod:`~meshshard.apps.chunk_budgets`): the kNN streams that many queries a round
    (:func:`meshshard.ops.knn_chunks`), the features are written into the output as they
    come, and the standardisation runs in place, in steps; the statistics are float64 sums
    (``build_inputs`` takes them in float32: the two agree to float32 rounding). ``release``
    hands each round's freed heap pages back to the OS (glibc's ``malloc_trim``; a no-op
    elsewhere)."""
    group = coords.device_mesh.get_group()
    total = int(sum(sizes))
    with torch.no_grad():
        c, nrm = coords.to_local(), normals.to_local()
        feats = torch.empty((c.shape[0], 3 + 4), dtype=c.dtype)
        feats[:, :3] = nrm
        geo = feats[:, 3:]  # a view: the features go straight into the output
        # every rank runs the same rounds (knn_chunks and both gathers)
        for a, b, d, idx in ops.knn_chunks(coords, knn, loop=False,
                                           max_queries_per_chunk=max_queries_per_chunk):
            nb = torch.cat([ops.gather_neighbors(coords, idx),
                            ops.gather_neighbors(normals, idx)], dim=-1)
            geo[a:b] = features_from_neighbours(c[a:b], nrm[a:b], d, nb, knn)
            del d, idx, nb
            if release:  # the round's freed pages back to the OS (glibc malloc_trim)
                trim_heap()
        _standardise_into(geo, geo, group, total)
        coords_n = torch.empty_like(c)
        _standardise_into(coords_n, c, group, total)
    return coords_n.unsqueeze(0), feats.unsqueeze(0)
