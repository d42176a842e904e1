"""Rank functions for the chunked kNN tests (module level: they must be picklable)."""

from __future__ import annotations

import numpy as np
import torch

from tests.ops._fns import _shard, _weights, leaf_shards


def knn_chunk_cases(rank: int, P: int, cases: list[dict]) -> list[dict]:
    """Each case streamed by :func:`knn_chunks` (one backward per chunk) and, beside it, the
    all-at-once :func:`meshshard.ops.functional.knn` on the same shard."""
    from meshshard.ops.functional import knn
    from meshshard.ops.knn_chunks import knn_chunks

    out = []
    for case in cases:
        x, y = leaf_shards(case, rank, P)
        kw = dict(loop=case.get("loop", True), backend=case.get("backend", "auto"),
                  nboxes=case.get("nboxes", 16))
        m = (x if y is None else y).shape[0]
        w = _weights((m, case["k"]), rank)
        ds, idx, spans, stats = [], [], [], {}
        for a, b, d, i in knn_chunks(x, case["k"], y, max_queries_per_chunk=case["chunk"],
                                     stats=stats, **kw):
            (d * w[a:b]).sum().backward()  # collective, every round on every rank
            ds.append(d.detach())
            idx.append(i)
            spans.append((a, b))
        d_all, i_all = knn(x.detach(), case["k"], None if y is None else y.detach(), **kw)
        out.append({
            "dist": torch.cat(ds).numpy(), "index": torch.cat(idx).numpy(),
            "spans": spans, "rounds": stats["rounds"],
            "gx": x.grad.numpy(), "gy": None if y is None else y.grad.numpy(),
            "dist_all": d_all.numpy(), "index_all": i_all.numpy(),
        })
    return out


def knn_chunk_st(rank: int, P: int, sizes: list[int], k: int, chunk: int) -> dict:
    """ShardTensor inputs, float32 like predict's coordinates."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.ops import knn, knn_chunks
    from meshshard.shardtensor import Shard, from_local

    case = {"x_sizes": sizes}
    _, xl = _shard(case, rank, P, "x")
    mesh = init_device_mesh("cpu", (P,))
    x = from_local(torch.tensor(xl, dtype=torch.float32), mesh, [Shard(0)],
                   sharding_shapes=list(sizes))
    got = [(a, b, d, i) for a, b, d, i in
           knn_chunks(x, k, loop=False, max_queries_per_chunk=chunk)]
    d_all, i_all = knn(x, k, loop=False)
    return {"dist": np.concatenate([g[2].numpy() for g in got]) if got else np.zeros((0, k)),
            "index": np.concatenate([g[3].numpy() for g in got]) if got else np.zeros((0, k)),
            "dist_all": d_all.to_local().numpy(), "index_all": i_all.to_local().numpy()}


def knn_chunk_cost(rank: int, P: int, n: int, chunk: int, shuffle: bool) -> dict:
    """Rows put into the per-round trees for a curve of ``n`` points stored in curve order
    (each rank a contiguous piece), or with each rank's rows shuffled."""
    from meshshard.ops.functional import knn
    from meshshard.ops.knn_chunks import knn_chunks

    t = torch.linspace(0, 6 * np.pi, n, dtype=torch.float64)
    pts = torch.stack([torch.cos(t), torch.sin(t), t / 10], 1)
    mine = pts[rank * n // P : (rank + 1) * n // P]
    if shuffle:
        mine = mine[torch.randperm(mine.shape[0], generator=torch.Generator().manual_seed(rank))]
    stats: dict = {}
    got = torch.cat([i for _, _, _, i in knn_chunks(mine, 6, loop=False,
                                                       max_queries_per_chunk=chunk, stats=stats)])
    _, want = knn(mine, 6, loop=False)
    return {"equal": bool(torch.equal(got, want)), "rows": mine.shape[0], **stats}
