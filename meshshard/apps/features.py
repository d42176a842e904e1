"""The model's inputs built with bounded temporaries: kNN once, neighbour rows gathered and
turned into features ``chunk`` rows at a time (every rank runs the same number of rounds).
Equal to :func:`meshshard.train.build_inputs` (the same per-row arithmetic)."""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["chunked_inputs"]


def chunked_inputs(coords: Any, normals: Any, *, knn: int, chunk: int, sizes: list[int]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (1, n, 3) coordinates and (1, n, 7) features, as ``build_inputs`` makes
    them, from ShardTensors ``coords``/``normals`` (N, 3) sharded with ``sizes``.

    Collective: every rank of the mesh must call this (kNN, one neighbour gather per round,
    the global means)."""
    from meshshard import ops
    from meshshard.shardtensor import Shard, from_local
    from meshshard.train import _standardise, features_from_neighbours

    mesh = coords.device_mesh
    with torch.no_grad():
        d, idx = ops.knn(coords, knn, loop=False)
        d, idx = d.to_local(), idx.to_local()
        table = torch.cat([coords, normals], dim=-1)
        c, nrm = coords.to_local(), normals.to_local()
        n = c.shape[0]
        geo = torch.empty((n, 4), dtype=c.dtype)
        for r in range(math.ceil(max(sizes) / chunk) if max(sizes) else 0):
            a, b = min(r * chunk, n), min((r + 1) * chunk, n)
            nb = ops.gather_neighbors(table, idx[a:b])  # collective: every rank, every round
            geo[a:b] = features_from_neighbours(c[a:b], nrm[a:b], d[a:b], nb, knn)
        del d, idx, table
        geo = from_local(geo, mesh, [Shard(0)], sharding_shapes=sizes, validate=False)
        geo = _standardise(geo)
        coords_n = _standardise(coords)
        features = torch.cat([normals, geo], dim=-1)
    return coords_n.to_local().unsqueeze(0), features.to_local().unsqueeze(0)
