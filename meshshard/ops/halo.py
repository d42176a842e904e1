"""Halo exchange and neighbour gather / scatter by global index.

All three move rows with the one differentiable primitive
(:func:`meshshard.comm.rows.all_to_all`): gradients of ghost rows travel back to their owners
and are summed there. All are collective (forward, and backward when gradients flow).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from meshshard.comm.rows import all_gather_rows, all_to_all, exchange_counts
from meshshard.ops._validation import check_reduce, collective_flag
from meshshard.partition.record import HaloPlan

__all__ = ["gather_neighbors", "halo_exchange", "scatter_rows", "scatter_to_owners"]


def halo_exchange(
    features: torch.Tensor,
    plan: HaloPlan,
    *,
    group: dist.ProcessGroup | None = None,
    check: bool = True,
) -> torch.Tensor:
    """This rank's rows followed by its ghost rows, as routed by ``plan``.

    Collective: every rank of ``group`` must call this (and ``backward`` when gradients flow).

    Parameters
    ----------
    features : Tensor of shape (n_local, ...)
        This rank's rows (stored order).
    plan : HaloPlan
        Same plan on every rank; ``plan.nparts`` must equal the group size.
    check : bool
        Verify collectively (one small all_reduce) that every rank's row count matches the
        plan, so a mismatch raises everywhere instead of hanging.

    Returns
    -------
    Tensor of shape (n_local + h_local, ...)
        Ghosts grouped by source shard in increasing shard order, each group in the plan's
        order. Differentiable: ghost gradients are summed into the owners' rows.

    Raises
    ------
    ValueError
        Plan size differs from the group size, or the rows do not match the plan.
    """
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    if not isinstance(plan, HaloPlan):
        msg = f"halo_exchange: plan must be a HaloPlan, got {type(plan).__name__}"
        raise TypeError(msg)
    if plan.nparts != P:
        msg = (
            f"halo_exchange: the plan has {plan.nparts} shards but the group has {P} ranks; "
            "build the plan for this many ranks"
        )
        raise ValueError(msg)
    off = np.asarray(plan.offsets)
    expected = int(off[rank + 1] - off[rank])
    problem = None
    if features.dim() < 1 or features.shape[0] != expected:
        problem = (
            f"halo_exchange: rank {rank} holds {tuple(features.shape)} but the plan expects "
            f"{expected} rows; pass this rank's shard of the partition the plan was built for"
        )
    if check:
        collective_flag(problem, group=group, device=features.device, op="halo_exchange")
    elif problem is not None:
        raise ValueError(problem)
    dev = features.device
    send_idx = torch.as_tensor(np.asarray(plan.send_idx[rank]), dtype=torch.int64, device=dev)
    send = plan.send_counts(rank).tolist()
    recv = plan.recv_counts(rank).tolist()
    ghosts = all_to_all(features[send_idx], send, recv, group)
    return torch.cat([features, ghosts])


def _sizes(
    features: torch.Tensor, sizes: Sequence[int] | None, group: dist.ProcessGroup | None
) -> list[int]:
    if sizes is not None:
        return [int(s) for s in sizes]
    n = torch.tensor([features.shape[0]], dtype=torch.int64, device=features.device)
    return [int(v) for v in all_gather_rows(n, group).flatten().tolist()]


def _owners(flat: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return torch.searchsorted(offsets[1:], flat, right=True)


def _index_problem(index: torch.Tensor, total: int, op: str, rank: int) -> str | None:
    if not isinstance(index, torch.Tensor) or index.dtype not in (
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
    ):
        what = index.dtype if isinstance(index, torch.Tensor) else type(index).__name__
        return f"{op}: index must be an integer tensor, got {what} on rank {rank}; use .long()"
    if index.numel():
        lo, hi = int(index.min()), int(index.max())
        if lo < -1 or hi >= total:
            return (
                f"{op}: rank {rank} has index values in [{lo}, {hi}] but valid global indices "
                f"are -1 (padding) and 0..{total - 1}"
            )
    return None


def gather_neighbors(
    features: torch.Tensor,
    index: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    sizes: Sequence[int] | None = None,
) -> torch.Tensor:
    """Rows of the distributed ``features`` at global indices; ``-1`` gives zeros.

    Only remote rows that ``index`` references are fetched, each once (deduplicated).

    Collective: every rank of ``group`` must call this (and ``backward`` when gradients flow).

    Parameters
    ----------
    features : Tensor of shape (n_local, *F)
        This rank's rows.
    index : Tensor of any shape, integer
        Global row indices (stored order), ``-1`` for padding.
    sizes : sequence of int, optional
        Every rank's row count; gathered (one collective) when omitted.

    Returns
    -------
    Tensor of shape (*index.shape, *F)
        Differentiable w.r.t. ``features`` on every rank (gradients summed at the owners).
    """
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    sz = _sizes(features, sizes, group)
    dev = features.device
    problem = None
    if len(sz) != P or sz[rank] != features.shape[0]:
        problem = (
            f"gather_neighbors: sizes={sz} do not fit rank {rank} holding "
            f"{features.shape[0]} rows in a group of {P}; pass every rank's row count"
        )
    else:
        problem = _index_problem(index, sum(sz), "gather_neighbors", rank)
    collective_flag(problem, group=group, device=dev, op="gather_neighbors")
    offsets = torch.tensor([0, *np.cumsum(sz).tolist()], dtype=torch.int64, device=dev)
    flat = index.reshape(-1).to(device=dev, dtype=torch.int64)
    valid = flat >= 0
    owner = _owners(flat.clamp_min(0), offsets)
    remote = valid & (owner != rank)
    uniq = torch.unique(flat[remote])  # sorted, hence grouped by owner
    u_owner = _owners(uniq, offsets)
    send_counts = torch.bincount(u_owner, minlength=P).tolist()
    recv_counts = exchange_counts(send_counts, group, dev)
    requests = all_to_all(uniq - offsets[u_owner], send_counts, recv_counts, group)
    reply = all_to_all(features[requests], recv_counts, send_counts, group)
    # rows picked from features and reply directly: no copy of the (maybe large) features
    out = features.new_zeros((flat.numel(), *features.shape[1:]))  # padding stays zero
    local = valid & ~remote
    out[local] = features[flat[local] - offsets[rank]]
    out[remote] = reply[torch.searchsorted(uniq, flat[remote])]
    return out.reshape(*index.shape, *features.shape[1:])


def scatter_to_owners(
    values: torch.Tensor,
    index: torch.Tensor,
    reduce: str = "sum",
    *,
    sizes: Sequence[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Send values to the owner rows of their global indices and reduce them there.

    Collective: every rank of ``group`` must call this (and ``backward`` when gradients flow).

    Parameters
    ----------
    values : Tensor of shape (*index.shape, *F)
    index : Tensor of any shape, integer
        Global destination rows (stored order); ``-1`` entries are ignored.
    reduce : {"sum", "mean", "max"}
        Rows that receive nothing are 0.
    sizes : sequence of int
        Every rank's row count of the destination (the output has ``sizes[rank]`` rows).

    Returns
    -------
    Tensor of shape (sizes[rank], *F)
        Differentiable w.r.t. ``values`` on every rank.
    """
    check_reduce(reduce)
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    sz = [int(s) for s in sizes]
    dev = values.device
    problem = None
    if len(sz) != P:
        problem = f"scatter_to_owners: sizes has {len(sz)} entries for a group of {P} ranks"
    else:
        problem = _index_problem(index, sum(sz), "scatter_to_owners", rank)
        if problem is None and tuple(values.shape[: index.dim()]) != tuple(index.shape):
            problem = (
                f"scatter_to_owners: values {tuple(values.shape)} must start with "
                f"index's shape {tuple(index.shape)} on rank {rank}"
            )
    collective_flag(problem, group=group, device=dev, op="scatter_to_owners")
    feat = values.shape[index.dim() :]
    offsets = torch.tensor([0, *np.cumsum(sz).tolist()], dtype=torch.int64, device=dev)
    flat = index.reshape(-1).to(device=dev, dtype=torch.int64)
    vals = values.reshape(-1, *feat)
    keep = torch.nonzero(flat >= 0).flatten()
    flat, vals = flat[keep], vals[keep]
    owner = _owners(flat, offsets)
    o = torch.argsort(owner, stable=True)
    flat, vals, owner = flat[o], vals[o], owner[o]
    send_counts = torch.bincount(owner, minlength=P).tolist()
    recv_counts = exchange_counts(send_counts, group, dev)
    rows = all_to_all(flat - offsets[owner], send_counts, recv_counts, group)
    got = all_to_all(vals, send_counts, recv_counts, group)
    return scatter_rows(got, rows, sz[rank], reduce)


def scatter_rows(values: torch.Tensor, index: torch.Tensor, rows: int, reduce: str) -> torch.Tensor:
    """``out[index[e]] (+)= values[e]`` with sum / mean / max; empty rows are 0."""
    feat = values.shape[1:]
    out = values.new_zeros((rows, *feat))
    if reduce == "max":
        idx = index.reshape(-1, *([1] * len(feat))).expand_as(values)
        return out.scatter_reduce(0, idx, values, reduce="amax", include_self=False)
    out = out.index_add(0, index, values)
    if reduce == "mean":
        cnt = torch.bincount(index, minlength=rows).clamp_min(1).to(out.dtype)
        out = out / cnt.reshape(-1, *([1] * len(feat)))
    return out
