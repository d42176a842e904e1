"""``attn_mask`` of ``F.scaled_dot_product_attention`` on ShardTensors: this rank's piece of the
mask in the form the ring kernels take (:class:`.attention_ring.AttnPlan`): additive, 4-d, rows
= this rank's query rows (or 1), columns = a contiguous range of keys in global order.

Layouts accepted, per mesh dim (the checks read global layouts only, so every rank raises
alike, before any collective):

- replicated (or a plain tensor): cut to the query's piece where the query is sharded;
- sharded like the query (same dim, same sizes: rows, batch or heads): used as it is;
- sharded on its last (key) dim, any sizes, bool or additive. Where the keys are sharded on
  their tokens on that mesh dim and the query is whole (mode ``"merge"``), with the keys' sizes:
  each rank's columns are exactly its keys, nothing moves. With a query dim of 1 (a key-padding
  mask, one row per batch/head): the columns are all-gathered (one collective, ``B x Lk``
  elements; cheaper than sending them with every key block, once per head and key chunk).
  With query rows sharded on that mesh dim and a full row dim: one uneven all-to-all gives each
  rank its query rows of every column (what a mask sharded like the query rows holds; no rank
  holds the whole mask). Otherwise the columns are all-gathered.

A Partial or flattened mask, or one sharded on a dim in another way, raises
:class:`meshshard.errors.LayoutError`.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import Partial, Shard

from meshshard.errors import LayoutError
from meshshard.shardtensor._aten.dispatch import _all_gather_v, _coord, _fc, _narrow, check
from meshshard.shardtensor._aten.tensor import SHARDED, ShardTensor

__all__ = ["mask_local"]

_NAME = "scaled_dot_product_attention"


def _plan_dims(mask, ms, qs, ks, ring_dim, mode, nd) -> list[tuple[int, str]]:
    """Per mesh dim what to do: "keep" (sharded like the query, or nothing to cut), "cut"
    (replicated, query sharded: narrow), "own" (columns are this rank's keys), "gather"
    (all-gather the columns), "rows" (all-to-all columns -> query rows). Raises LayoutError."""
    mnd = mask.ndim
    rows_d, cols_d = mnd - 2, mnd - 1
    todo = []
    for i, p in enumerate(ms.placements):
        qp = qs.placements[i]
        q_d = qp.dim - (nd - mnd) if isinstance(qp, Shard) else None
        if isinstance(p, Partial):
            msg = f"{_NAME}: a Partial attn_mask is not supported; replicate it (mesh dim {i})"
            raise LayoutError(msg)
        if isinstance(p, SHARDED) and not isinstance(p, Shard):
            msg = f"{_NAME}: attn_mask has a flattened layout {p}; reshape it back first"
            raise LayoutError(msg)
        if isinstance(p, Shard) and p.dim == cols_d:
            k_tok = isinstance(ks.placements[i], Shard) and ks.placements[i].dim == nd - 2
            if i == ring_dim and mode == "merge" and k_tok and ms.sizes[i] == ks.sizes[i]:
                todo.append((i, "own"))
            elif q_d == rows_d and mask.shape[rows_d] != 1:
                todo.append((i, "rows"))
            else:
                todo.append((i, "gather"))
            continue
        if isinstance(p, Shard):
            if q_d is not None and p.dim == q_d and ms.sizes[i] == qs.sizes[i]:
                todo.append((i, "keep"))
                continue
            msg = (
                f"{_NAME}: attn_mask layout {ms!r} does not match the query's {qs!r} on "
                f"mesh dim {i}: shard it like the query rows (same dim, same "
                "sizes), shard it on its key dim (e.g. a key-padding mask like the keys), or "
                "replicate it"
            )
            raise LayoutError(msg)
        if q_d is not None and q_d >= 0 and mask.shape[q_d] != 1:
            todo.append((i, "cut"))
    return todo


def _rows_of_columns(local: torch.Tensor, rows_d: int, q_sizes, m_sizes, mesh, i: int):
    """A mask sharded on its key columns (all query rows) re-split to this rank's query rows x
    every key column: one uneven all-to-all (rank r receives its rows of every rank's columns).
    Collective over mesh dim ``i``."""
    me = _coord(mesh)[1][i]
    x = local.movedim(rows_d, 0)  # (Lq, *lead, n_me)
    lead = tuple(x.shape[1:-1])
    per = math.prod(lead)
    offs = [sum(q_sizes[:r]) for r in range(len(q_sizes))]
    send = torch.cat([x.narrow(0, o, n).reshape(-1) for o, n in zip(offs, q_sizes)])
    send_n = [n * per * m_sizes[me] for n in q_sizes]
    recv_n = [q_sizes[me] * per * m for m in m_sizes]
    check("all_to_all", mesh, i, send, "attn_mask key columns to query rows", varying_dim=0)
    got = _fc.wait_tensor(_fc.all_to_all_single(send, recv_n, send_n, _coord(mesh)[2][i]))
    pieces = [t.view(q_sizes[me], *lead, m) for t, m in zip(got.split(recv_n), m_sizes)]
    return torch.cat(pieces, dim=-1).movedim(0, rows_d)


def mask_local(mask, ms, qs, ks, ring_dim: int | None, mode: str, nd: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """(this rank's additive 4-d mask, global index of its first key column); see the module
    docstring. ``ms``, ``qs``, ``ks``: the specs of mask, query and key (Partial reduced).

    Collective over the mesh dims whose columns are gathered or re-split (every rank calls it
    with the same layouts)."""
    todo = _plan_dims(mask, ms, qs, ks, ring_dim, mode, nd)
    local = mask._local if isinstance(mask, ShardTensor) else mask
    if local.dtype == torch.bool:  # additive before anything moves (gloo sends no bools)
        local = torch.zeros(local.shape, dtype=dtype, device=local.device).masked_fill(
            ~local, float("-inf"))
    else:
        local = local.to(dtype)
    mnd = mask.ndim
    coord = _coord(ms.mesh)[1]
    col0 = 0
    for i, what in todo:
        if what == "own":
            col0 = sum(ks.sizes[i][: coord[i]])
        elif what == "gather":
            local = _all_gather_v(local, mnd - 1, ms.sizes[i], ms.mesh, i)
        elif what == "rows":
            local = _rows_of_columns(local, mnd - 2, qs.sizes[i], ms.sizes[i], ms.mesh, i)
    for i, what in todo:  # then cut replicated dims to the query's piece
        q_d = qs.placements[i].dim - (nd - mnd) if isinstance(qs.placements[i], Shard) else None
        gathered_rows = (what == "gather" and q_d is not None and q_d >= 0
                         and local.shape[q_d] != 1)
        if what == "cut" or gathered_rows:
            local = _narrow(local, q_d, qs.sizes[i], coord[i])
    want = 4 if nd == 4 else 3
    while local.ndim < want:
        local = local.unsqueeze(0)
    return (local.unsqueeze(1) if nd == 3 else local), col0
