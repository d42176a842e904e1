"""Autograd-aware collectives on local tensors over process groups (every function here is a
collective), for ops that work on a ShardTensor's pieces (``meshshard.ops``).

Gradient convention (what makes replicated-weight gradients exact with no manual scaling): the
local gradient of a *Replicate* value is the full gradient (identical on every rank); of a
*Shard* value, the gradient of the local rows; of a *Partial* value, the gradient with respect to
each partial term (the full gradient of the reduced value). Every function below preserves it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from meshshard.collective_check import check_collective

__all__ = [
    "all_gather_v",
    "all_reduce",
    "all_to_all_v",
    "grad_all_reduce",
    "split_local",
]



_SIZES: dict[int, tuple] = {}


def _group_size(group) -> int:
    """``dist.get_world_size(group)``, remembered per group object (asked on every op)."""
    hit = _SIZES.get(id(group))
    if hit is not None and hit[0] is group:
        return hit[1]
    n = dist.get_world_size(group)
    if group is not None:
        _SIZES[id(group)] = (group, n)  # holds the group: a new one never reuses this id
    return n


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, op: str, group) -> torch.Tensor:
        n = _group_size(group)
        if n > 1:
            check_collective("all_reduce", group, x, detail=op)
            out = T.reduce(x.detach(), "sum" if op == "avg" else op, group)
        else:
            out = x.detach().clone().contiguous()
        if op == "avg":
            out = out / n
        ctx.op, ctx.group, ctx.n = op, group, n
        if op in ("max", "min"):
            # the gradient goes to the lowest rank holding the extreme value (exact, no doubling)
            hit = (x.detach() == out).to(torch.int32)
            rank = dist.get_rank(group) if n > 1 else 0
            claim = torch.where(hit.bool(), torch.full_like(hit, rank), torch.full_like(hit, n))
            if n > 1:
                check_collective("all_reduce", group, claim, detail=f"min: {op} owner")
                claim = T.reduce(claim, "min", group)
            ctx.save_for_backward(claim == rank)
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        if ctx.op == "sum":
            return g, None, None
        if ctx.op == "avg":
            return g / ctx.n, None, None
        (mine,) = ctx.saved_tensors
        return g * mine.to(g.dtype), None, None


def all_reduce(x: torch.Tensor, op: str, group) -> torch.Tensor:
    """Reduce ``x`` over ``group`` (differentiable). Collective."""
    return _AllReduce.apply(x, op, group)


class _GradAllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, groups: tuple) -> torch.Tensor:
        ctx.groups = groups
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        g = g.contiguous()
        for group in ctx.groups:
            if _group_size(group) > 1:
                check_collective("all_reduce", group, g, detail="sum: gradient")
                g = T.reduce(g, "sum", group)
        return g, None


def grad_all_reduce(x: torch.Tensor, groups: Sequence) -> torch.Tensor:
    """Identity forward; sum the gradient over ``groups`` in backward.

    Used where a replicated value meets sharded or partial data: its local gradient is then only
    this rank's contribution. Collective in backward.
    """
    groups = tuple(g for g in groups if _group_size(g) > 1)
    if not groups or not (x.requires_grad and torch.is_grad_enabled()):
        return x
    return _GradAllReduce.apply(x, groups)


def _gather_pieces(x: torch.Tensor, dim: int, sizes: Sequence[int], group) -> torch.Tensor:
    n = len(sizes)
    if n == 1:
        return x
    x = x.contiguous()
    m = max(sizes)
    if m == 0:
        return x
    pad_shape = list(x.shape)
    pad_shape[dim] = m - x.shape[dim]
    padded = torch.cat([x, x.new_zeros(pad_shape)], dim=dim) if pad_shape[dim] else x
    check_collective("all_gather", group, padded, detail="uneven rows")
    bufs = T.all_gather(padded, n, group)
    return torch.cat([b.narrow(dim, 0, s) for b, s in zip(bufs, sizes)], dim=dim)


class _AllGatherV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, sizes, group):
        ctx.dim, ctx.sizes = dim, tuple(sizes)
        ctx.rank = dist.get_rank(group) if len(sizes) > 1 else 0
        return _gather_pieces(x.detach(), dim, sizes, group)

    @staticmethod
    def backward(ctx, g):
        start = sum(ctx.sizes[: ctx.rank])
        return g.narrow(ctx.dim, start, ctx.sizes[ctx.rank]), None, None, None


def all_gather_v(x: torch.Tensor, dim: int, sizes: Sequence[int], group) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` with uneven ``sizes`` (differentiable).

    Collective. The result is replicated; its backward keeps this rank's slice of the (full)
    gradient.
    """
    return _AllGatherV.apply(x, dim, tuple(int(s) for s in sizes), group)


class _SplitLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, sizes, group):
        ctx.dim, ctx.sizes, ctx.group = dim, tuple(sizes), group
        rank = dist.get_rank(group) if len(sizes) > 1 else 0
        start = sum(sizes[:rank])
        return x.narrow(dim, start, sizes[rank]).clone()

    @staticmethod
    def backward(ctx, g):
        return _gather_pieces(g, ctx.dim, ctx.sizes, ctx.group), None, None, None


def split_local(x: torch.Tensor, dim: int, sizes: Sequence[int], group) -> torch.Tensor:
    """Replicate -> Shard: keep this rank's rows of a replicated ``x`` (no data moves forward;
    backward all-gathers the gradient pieces into the full replicated gradient). Collective in
    backward."""
    return _SplitLocal.apply(x, dim, tuple(int(s) for s in sizes), group)


def _a2a(x: torch.Tensor, send: Sequence[int], recv: Sequence[int], group) -> torch.Tensor:
    x = x.contiguous()
    if _group_size(group) == 1:
        return x.clone()
    check_collective("all_to_all_single", group, x, varying_dim=0)
    return T.all_to_all_single(x, recv, send, group)


class _AllToAllV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _a2a(x.detach(), send, recv, group)

    @staticmethod
    def backward(ctx, g):
        return _a2a(g, ctx.recv, ctx.send, ctx.group), None, None, None


def all_to_all_v(
    x: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], group
) -> torch.Tensor:
    """Uneven all-to-all along dim 0 (differentiable: backward is the reverse exchange).

    ``x`` holds the rows for rank 0, then rank 1, ...; ``send_counts[q]`` rows go to rank ``q``
    and ``recv_counts[q]`` arrive from rank ``q``. Collective.
    """
    return _AllToAllV.apply(x, tuple(map(int, send_counts)), tuple(map(int, recv_counts)), group)


# ------------------------------------------------------------------ plain collectives
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class T:
    """Not differentiable, eager: what the autograd functions above run."""

    @staticmethod
    def reduce(t: torch.Tensor, op: str, group) -> torch.Tensor:
        out = t.detach().clone().contiguous()
        dist.all_reduce(out, op=_OPS[op], group=group)
        return out

    @staticmethod
    def all_gather(t: torch.Tensor, n: int, group) -> list[torch.Tensor]:
        t = t.contiguous()
        bufs = [torch.empty_like(t) for _ in range(n)]
        dist.all_gather(bufs, t, group=group)
        return bufs

    @staticmethod
    def all_to_all_single(x: torch.Tensor, recv: Sequence[int], send: Sequence[int],
                          group) -> torch.Tensor:
        x = x.contiguous()
        recv, send = [int(v) for v in recv], [int(v) for v in send]
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x, recv, send, group=group)
        return out
