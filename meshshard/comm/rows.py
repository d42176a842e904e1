"""Rows between ranks: the uneven ``all_to_all_single`` every row exchange ends in
(:func:`a2a_into`), its differentiable form (:func:`all_to_all`), counts, small gathers and the
agreement flag.

Every op of :mod:`meshshard.ops` moves rows with :func:`all_to_all`, an autograd Function
whose backward is the reverse all-to-all (gradients of received rows travel back to the rank
that sent them, where autograd's indexing backward sums them into the owning rows). Counts
always travel first (:func:`exchange_counts`), so every call uses explicit split sizes and
uneven layouts, empty shards included, work on gloo and NCCL alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from meshshard.comm.check import check_collective

# torch >= 2.12 renamed all_gather_into_tensor (which now warns) to all_gather_single
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

__all__ = [
    "a2a_into",
    "all_gather_rows",
    "all_to_all",
    "collective_flag",
    "exchange_counts",
    "exchange_plan",
    "group_rank",
    "group_size",
]


def group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    return dist.get_rank(group)


def _comm_device(t: torch.Tensor, group: dist.ProcessGroup | None) -> torch.device:
    # NCCL only moves CUDA tensors; gloo moves CPU (and, through staging, CUDA) tensors.
    return t.device


def exchange_counts(
    send_counts: Sequence[int] | torch.Tensor,
    group: dist.ProcessGroup | None,
    device: torch.device | str = "cpu",
) -> list[int]:
    """Tell every rank how many rows it will receive from each rank.

    Collective: every rank of ``group`` must call this.

    Parameters
    ----------
    send_counts : sequence of int, length P
        Rows this rank sends to each rank.

    Returns
    -------
    list of int, length P
        Rows this rank receives from each rank.
    """
    send = torch.as_tensor(send_counts, dtype=torch.int64).to(device)
    recv = torch.empty_like(send)
    check_collective("all_to_all_single", group, send, detail="row counts")
    dist.all_to_all_single(recv, send, group=group)
    return [int(v) for v in recv.tolist()]


def exchange_plan(
    send_counts: torch.Tensor,
    group: dist.ProcessGroup | None,
    extra: torch.Tensor | None = None,
) -> tuple[list[int], list[int], list[list[int]]]:
    """Every rank's send counts (kept on the device until now) and a few extra numbers, with
    one collective and one read-back: the only host sync of a row exchange.

    Collective: every rank of ``group`` must call this.

    Parameters
    ----------
    send_counts : Tensor of shape (P,), integer, on the device
        Rows this rank sends to each rank.
    extra : Tensor of shape (E,), integer, optional
        Numbers every rank should see (problem flags, sizes); the same E on every rank.

    Returns
    -------
    send : list of int, length P
        ``send_counts`` on the host.
    recv : list of int, length P
        Rows this rank receives from each rank.
    extras : list of P lists of E ints
        Every rank's ``extra``.
    """
    P, rank = group_size(group), group_rank(group)
    row = send_counts.to(torch.int64).reshape(-1)
    if extra is not None:
        row = torch.cat([row, extra.to(device=row.device, dtype=torch.int64).reshape(-1)])
    table = all_gather_rows(row, group).tolist()  # the one host sync
    send = table[rank][:P]
    recv = [table[q][rank] for q in range(P)]
    return send, recv, [t[P:] for t in table]


def a2a_into(out: torch.Tensor, rows: torch.Tensor, send: list[int], recv: list[int],
             group: dist.ProcessGroup | None) -> None:
    """The raw uneven all-to-all every row exchange of meshshard ends in: ``rows`` (contiguous,
    ``sum(send)`` rows, grouped by destination) go out, ``out`` (``sum(recv)`` rows, a
    contiguous buffer or slice) receives by source rank. Not differentiable; collective."""
    check_collective("all_to_all_single", group, rows, varying_dim=0)
    dist.all_to_all_single(out, rows, recv, send, group=group)


def _a2a(
    x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None
) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(recv), *x.shape[1:]))
    a2a_into(out, x, send, recv, group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group):  # type: ignore[override]
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _a2a(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _a2a(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def all_to_all(
    x: torch.Tensor,
    send_counts: Sequence[int],
    recv_counts: Sequence[int] | None = None,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Send ``x``'s rows to the ranks in order: the first ``send_counts[0]`` to rank 0, ...

    Differentiable: the backward is the reverse all-to-all, so a rank's backward must run
    whenever any rank's does (every rank calls ``backward`` on a loss that uses the result).

    Collective: every rank of ``group`` must call this (and, for gradients, its backward).

    Parameters
    ----------
    x : Tensor of shape (sum(send_counts), ...)
    send_counts : sequence of int, length P
    recv_counts : sequence of int, length P, optional
        Rows received from each rank; exchanged with one extra collective when omitted.

    Returns
    -------
    Tensor of shape (sum(recv_counts), ...)
        Received rows grouped by source rank in increasing rank order.
    """
    send = [int(c) for c in send_counts]
    if sum(send) != x.shape[0]:
        msg = f"all_to_all: send_counts sum to {sum(send)} but x has {x.shape[0]} rows"
        raise ValueError(msg)
    if recv_counts is None:
        recv = exchange_counts(send, group, _comm_device(x, group))
    else:
        recv = [int(c) for c in recv_counts]
    if x.requires_grad and torch.is_grad_enabled():
        return _AllToAll.apply(x, send, recv, group)
    return _a2a(x, send, recv, group)


def all_gather_rows(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Gather a same-shaped small tensor from every rank: result has a leading dim of P.

    Collective: every rank of ``group`` must call this. Not differentiable (metadata only).
    """
    P = group_size(group)
    shape = x.shape
    x = x.reshape(1, -1).contiguous()  # gloo wants inputs concatenated along dim 0
    out = x.new_empty((P, x.shape[1]))
    check_collective("all_gather_into_tensor", group, x)
    _all_gather_single(out, x, group=group)
    return out.reshape(P, *shape)


def collective_flag(
    problem: str | None, *, group: dist.ProcessGroup | None, device: torch.device, op: str
) -> None:
    """Raise on every rank if any rank found a problem (one small all_reduce).

    Collective: every rank of ``group`` must call this.
    """
    flag = torch.tensor([0 if problem is None else 1], dtype=torch.int64, device=device)
    ranks = torch.zeros(dist.get_world_size(group), dtype=torch.int64, device=device)
    ranks[dist.get_rank(group)] = flag[0]
    check_collective("all_reduce", group, ranks, detail=f"sum: {op} input check")
    dist.all_reduce(ranks, group=group)
    if problem is not None:
        raise ValueError(problem)
    if ranks.any():
        bad = torch.nonzero(ranks.cpu()).flatten().tolist()
        msg = f"{op}: invalid input on rank(s) {bad} (see the error raised there)"
        raise ValueError(msg)
