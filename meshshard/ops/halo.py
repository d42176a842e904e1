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

from meshshard.comm.resident import cached_on_device, device_ints
from meshshard.comm.rows import all_gather_rows, all_to_all, exchange_plan
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
    send_idx = cached_on_device(plan, ("send_idx", rank), dev,
                                lambda: np.asarray(plan.send_idx[rank], dtype=np.int64))
    send = plan.send_counts(rank).tolist()
    recv = plan.recv_counts(rank).tolist()
    ghosts = all_to_all(features[send_idx], send, recv, group)
    return torch.cat([features, ghosts])


def _sizes(
    features: torch.Tensor, sizes: Sequence[int] | None, group: dist.ProcessGroup | None
) -> list[int]:
    if sizes is not None:
        return [int(s) for s in sizes]
    n = torch.full((1,), features.shape[0], dtype=torch.int64, device=features.device)
    return [int(v) for v in all_gather_rows(n, group).flatten().tolist()]


def _owners(flat: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return torch.searchsorted(offsets[1:], flat, right=True)


_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _dtype_problem(index, op: str, rank: int) -> str | None:
    if not isinstance(index, torch.Tensor) or index.dtype not in _INT_DTYPES:
        what = index.dtype if isinstance(index, torch.Tensor) else type(index).__name__
        return f"{op}: index must be an integer tensor, got {what} on rank {rank}; use .long()"
    return None


def _extra(problem: str | None, bad: torch.Tensor | None, device) -> torch.Tensor:
    """[host problem flag, out-of-range count]: checked by every rank after the one count
    exchange (no read-back of its own)."""
    flag = torch.full((1,), int(problem is not None), dtype=torch.int64, device=device)
    if bad is None:
        bad = torch.zeros(1, dtype=torch.int64, device=device)
    return torch.cat([flag, bad.reshape(1).to(torch.int64)])


def _raise_from_extras(extras, problem: str | None, index, total: int, op: str, rank: int):
    """Raise on every rank when any rank flagged a problem or held an index out of range."""
    if not any(f or b for f, b in extras):
        return
    if problem is not None:
        raise ValueError(problem)
    if extras[rank][1]:  # the error path may read the values back
        lo, hi = int(index.min()), int(index.max())
        msg = (
            f"{op}: rank {rank} has index values in [{lo}, {hi}] but valid global indices "
            f"are -1 (padding) and 0..{total - 1}"
        )
        raise ValueError(msg)
    bad = [q for q, (f, b) in enumerate(extras) if f or b]
    msg = f"{op}: invalid input on rank(s) {bad} (see the error raised there)"
    raise ValueError(msg)


def _offsets(sz: list[int], device) -> torch.Tensor:
    return device_ints([0, *np.cumsum(sz).tolist()], device)


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

    Host syncs: one (the read-back of every rank's request counts, which also carries the
    index check), plus one gather of the row counts when ``sizes`` is omitted. Counts, the
    distinct indices and the row offsets stay on the device.

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
    feat = tuple(features.shape[1:])
    problem = None
    if len(sz) != P or sz[rank] != features.shape[0]:
        problem = (
            f"gather_neighbors: sizes={sz} do not fit rank {rank} holding "
            f"{features.shape[0]} rows in a group of {P}; pass every rank's row count"
        )
    else:
        problem = _dtype_problem(index, "gather_neighbors", rank)
    total = sum(sz)
    if problem is not None:
        _, _, extras = exchange_plan(torch.zeros(P, dtype=torch.int64, device=dev), group,
                                     _extra(problem, None, dev))
        _raise_from_extras(extras, problem, index, total, "gather_neighbors", rank)
    offsets = _offsets(sz, dev)
    flat = index.reshape(-1).to(device=dev, dtype=torch.int64)
    inside = (flat >= 0) & (flat < total)
    bad = ((flat < -1) | (flat >= total)).sum()
    owner = _owners(flat.clamp(0, max(total - 1, 0)), offsets)
    remote = inside & (owner != rank)
    local = inside & (owner == rank)
    # the distinct remote indices, sorted (hence grouped by owner), found without a read-back:
    # non-remote entries sort last as ``total``; the first of each run of equals is kept
    skey = torch.sort(torch.where(remote, flat, total)).values
    first = torch.ones_like(skey, dtype=torch.bool)
    first[1:] = skey[1:] != skey[:-1]
    first &= skey < total
    s_owner = _owners(skey.clamp(max=max(total - 1, 0)), offsets)
    counts = torch.zeros(P, dtype=torch.int64, device=dev).index_add_(0, s_owner, first.long())
    send, recv, extras = exchange_plan(counts, group, _extra(None, bad, dev))
    _raise_from_extras(extras, None, index, total, "gather_neighbors", rank)
    U = sum(send)
    buf = skey.new_empty(U + 1)
    buf.scatter_(0, torch.where(first, torch.cumsum(first, 0) - 1, U), skey)
    uniq = buf[:U]
    requests = all_to_all(uniq - offsets[_owners(uniq, offsets)], send, recv, group)
    reply = all_to_all(features[requests], recv, send, group)
    # one pool: this rank's rows, the fetched rows, a zero row for padding
    n = features.shape[0]
    pool = torch.cat([features, reply, features.new_zeros((1, *feat))])
    at_remote = n + torch.searchsorted(uniq, flat).clamp(max=max(U - 1, 0))
    pos = torch.where(local, flat - offsets[rank], torch.where(remote, at_remote, n + U))
    out = pool[pos]
    return out.reshape(*index.shape, *feat)


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

    Host syncs: one (the read-back of every rank's send counts, which also carries the index
    check); the routing stays on the device.

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
        problem = _dtype_problem(index, "scatter_to_owners", rank)
        if problem is None and tuple(values.shape[: index.dim()]) != tuple(index.shape):
            problem = (
                f"scatter_to_owners: values {tuple(values.shape)} must start with "
                f"index's shape {tuple(index.shape)} on rank {rank}"
            )
    total = sum(sz)
    if problem is not None:
        _, _, extras = exchange_plan(torch.zeros(P, dtype=torch.int64, device=dev), group,
                                     _extra(problem, None, dev))
        _raise_from_extras(extras, problem, index, total, "scatter_to_owners", rank)
    feat = values.shape[index.dim() :]
    offsets = _offsets(sz, dev)
    flat = index.reshape(-1).to(device=dev, dtype=torch.int64)
    vals = values.reshape(-1, *feat)
    bad = ((flat < -1) | (flat >= total)).sum()
    inside = (flat >= 0) & (flat < total)
    # entries to drop get owner P and sort last: the first sum(send) rows are the ones sent
    owner = torch.where(inside, _owners(flat.clamp(0, max(total - 1, 0)), offsets), P)
    o = torch.argsort(owner, stable=True)
    flat, vals, owner = flat[o], vals[o], owner[o]
    counts = torch.zeros(P + 1, dtype=torch.int64, device=dev)
    counts.index_add_(0, owner, torch.ones_like(owner))
    send, recv, extras = exchange_plan(counts[:P], group, _extra(None, bad, dev))
    _raise_from_extras(extras, None, index, total, "scatter_to_owners", rank)
    S = sum(send)
    dest = flat[:S] - offsets[owner[:S]]
    rows = all_to_all(dest, send, recv, group)
    got = all_to_all(vals[:S], send, recv, group)
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
        cnt = torch.zeros(rows, dtype=out.dtype, device=out.device)
        cnt = cnt.index_add_(0, index, torch.ones_like(index, dtype=out.dtype)).clamp_min(1)
        out = out / cnt.reshape(-1, *([1] * len(feat)))
    return out
