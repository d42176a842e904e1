"""Halo exchange for grids: fetch any rows of a sharded spatial dim by global index.

Every grid rule (conv, pool, pad, interpolate) reduces to one step per sharded spatial dim:
"rank r needs global rows ``need_r`` (in this order, ``-1`` = a fill value) of this dim". The
plan is a pure function of the sharding sizes and the op's parameters, so every rank computes
every rank's needs without communicating, and only the rows that cross a cut move (one uneven
all-to-all per sharded dim). Rows come from whichever rank owns them: a neighbour thinner than
the halo (or empty) is simply skipped and the rows come from the ranks behind it. Circular
padding wraps between the first and the last rank the same way.

Differentiable: the backward of the all-to-all sends the halo gradients back to their owners,
where ``index_select``'s backward sums them into the local rows.

Two user controls:

- :func:`halo_limit` (``max_hops``): refuse plans that would fetch from ranks further than
  ``max_hops`` mesh coordinates away (e.g. to keep traffic neighbour-only) -- a clear error on
  every rank instead of a silent long-range fetch.
- :func:`count_halo_bytes`: count the bytes that cross ranks, forward and backward.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from meshshard.errors import LayoutError
from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._tracemode import constant

__all__ = ["HaloError", "count_halo_bytes", "fetch_rows", "halo_limit", "owner_of"]

_state = threading.local()


class HaloError(LayoutError):
    """A halo cannot be supplied under the current limits (raised on every rank)."""


@contextlib.contextmanager
def halo_limit(max_hops: int | None) -> Iterator[None]:
    """Refuse halo plans that fetch rows from ranks more than ``max_hops`` mesh coordinates
    away (``None``: no limit, the default). Circular wraps count ring distance."""
    prev = getattr(_state, "max_hops", None)
    _state.max_hops = max_hops
    try:
        yield
    finally:
        _state.max_hops = prev


class HaloStats:
    """Bytes of halo rows sent to other ranks by this rank (forward and backward)."""

    def __init__(self) -> None:
        self.forward = 0
        self.backward = 0
        self.calls = 0

    @property
    def total(self) -> int:
        return self.forward + self.backward


@contextlib.contextmanager
def count_halo_bytes() -> Iterator[HaloStats]:
    """Count the halo bytes this rank sends inside the block (backward counted when it runs
    inside the block too)."""
    prev = getattr(_state, "stats", None)
    stats = HaloStats()
    _state.stats = stats
    try:
        yield stats
    finally:
        _state.stats = prev


class _CountBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, stats, nbytes):
        ctx.stats, ctx.nbytes = stats, nbytes
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.stats.backward += ctx.nbytes
        return g, None, None


class _HaloSplit(torch.autograd.Function):
    """x -> (rows to send, the local run kept in the window). Backward writes both gradients
    into one buffer of x's shape (autograd would build two full-size zero tensors and add)."""

    @staticmethod
    def forward(ctx, x, dim, idx, k0, length):
        ctx.dim, ctx.k0, ctx.length = dim, k0, length
        ctx.save_for_backward(idx)
        ctx.shape = x.shape
        return x.index_select(dim, idx), x.narrow(dim, k0, length)

    @staticmethod
    def backward(ctx, g_send, g_core):
        (idx,) = ctx.saved_tensors
        ref = g_core if g_core is not None else g_send
        gx = ref.new_zeros(ctx.shape) if g_core is None or ctx.length != ctx.shape[ctx.dim] \
            else torch.empty(ctx.shape, dtype=ref.dtype, device=ref.device)
        if g_core is not None:
            gx.narrow(ctx.dim, ctx.k0, ctx.length).copy_(g_core)
        if g_send is not None and idx.numel():
            gx.index_add_(ctx.dim, idx, g_send)
        return gx, None, None, None, None


class _Join(torch.autograd.Function):
    """``out`` unchanged, with ``dep`` tied into its graph: the backward of ``dep`` (an
    all-to-all) then runs on every rank even where no received row was used."""

    @staticmethod
    def forward(ctx, out, dep):
        ctx.dep_shape, ctx.dep_dtype = dep.shape, dep.dtype
        return out.view_as(out)

    @staticmethod
    def backward(ctx, g):
        return g, g.new_zeros(ctx.dep_shape, dtype=ctx.dep_dtype)


def owner_of(idx: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Rank owning each global row index (indices must lie in ``[0, sum(sizes))``). Empty
    ranks own nothing."""
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    return np.searchsorted(ends, idx, side="right")


@functools.lru_cache(maxsize=4096)
def _plan(sizes: tuple, needs: tuple, me: int, periodic: bool, max_hops: int | None):
    """Send/receive index lists for ``me`` (cached: layouts repeat every step)."""
    n = len(sizes)
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    send_idx, send_counts = [], []
    for r in range(n):
        need = np.asarray(needs[r], dtype=np.int64)
        valid = need >= 0
        own = np.zeros(need.shape, dtype=bool)
        own[valid] = owner_of(need[valid], sizes) == me
        rows = need[own] - offs[me] if r != me else np.empty(0, dtype=np.int64)
        send_idx.append(rows)
        send_counts.append(int(rows.size))
    need = np.asarray(needs[me], dtype=np.int64)
    valid = need >= 0
    owner = np.full(need.shape, -1, dtype=np.int64)
    owner[valid] = owner_of(need[valid], sizes)
    if max_hops is not None:
        for r in range(n):
            nr = np.asarray(needs[r], dtype=np.int64)
            nr = nr[nr >= 0]
            if nr.size == 0:
                continue
            q = owner_of(nr, sizes)
            dist = np.abs(q - r)
            if periodic:
                dist = np.minimum(dist, n - dist)
            if int(dist.max()) > max_hops:
                far = int(q[np.argmax(dist)])
                msg = (
                    f"halo too large for halo_limit(max_hops={max_hops}): rank {r} (rows "
                    f"{list(sizes)}) needs rows owned by rank {far}, {int(dist.max())} ranks "
                    "away; its neighbours are thinner than the halo. Rebalance the split "
                    "(redistribute(sizes=...)) or raise max_hops"
                )
                raise HaloError(msg)
    recv_counts = [int(np.count_nonzero(owner == q)) if q != me else 0 for q in range(n)]
    # position of every needed row in [local rows | received rows | fill row]
    n_local = sizes[me]
    n_recv = sum(recv_counts)
    src = np.empty(need.shape, dtype=np.int64)
    mine = owner == me
    src[mine] = need[mine] - offs[me]
    remote = (owner >= 0) & ~mine
    # received rows arrive grouped by sender (ascending), each group in position order
    order = np.argsort(owner[remote], kind="stable")
    pos = np.flatnonzero(remote)[order]
    src[pos] = n_local + np.arange(n_recv)
    src[owner < 0] = n_local + n_recv
    # fast path: [remote/fill prefix] + one contiguous local run + [remote/fill suffix]
    run = None
    mi = np.flatnonzero(mine)
    if mi.size and mi[-1] - mi[0] + 1 == mi.size and np.all(np.diff(src[mi]) == 1):
        run = (int(mi[0]), int(mi[-1]) + 1, int(src[mi[0]]))
    # does any rank need a row another rank owns? (the same answer on every rank)
    moves = False
    for r in range(n):
        nr = np.asarray(needs[r], dtype=np.int64)
        nr = nr[nr >= 0]
        if nr.size and bool((owner_of(nr, sizes) != r).any()):
            moves = True
            break
    return (
        tuple(constant(s) for s in send_idx),
        tuple(send_counts),
        tuple(recv_counts),
        constant(src),
        run,
        bool((owner < 0).any()),
        moves,
    )


def fetch_rows(
    x: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    needs: Sequence[Sequence[int]],
    group,
    me: int,
    *,
    fill: float = 0.0,
    periodic: bool = False,
) -> torch.Tensor:
    """Rows ``needs[me]`` (global indices along ``dim``; ``-1`` = ``fill``) of a tensor sharded
    along ``dim`` with ``sizes``, in that order.

    ``needs`` holds every rank's request (a pure function of the layout, computed alike on
    every rank). Differentiable. Collective: every rank of ``group`` must call this with the
    same ``sizes`` and ``needs``.

    Raises
    ------
    HaloError
        Under :func:`halo_limit`, when a request reaches further than ``max_hops`` ranks
        (raised on every rank, before any communication).
    """
    sizes = tuple(int(s) for s in sizes)
    needs_t = tuple(tuple(int(v) for v in nd) for nd in needs)
    send_idx, send_counts, recv_counts, src, run, has_fill, moves = _plan(
        sizes, needs_t, me, periodic, getattr(_state, "max_hops", None)
    )
    dev = x.device
    if not moves:
        # no rank needs another's rows (e.g. pool 2/2 or a 1x1 conv on even slabs): every rank
        # knows it from the same plan, so all of them skip the all-to-all and its wait
        if not has_fill and run is not None and run[1] - run[0] == src.numel():
            return x.narrow(dim, run[2], run[1] - run[0])
        if has_fill:
            shape = list(x.shape)
            shape[dim] = 1
            x = torch.cat([x, torch.full(shape, fill, dtype=x.dtype, device=dev)], dim)
        return x.index_select(dim, src.to(dev))
    # rows travel along dim 0 (all-to-all); everything else is indexed along ``dim`` so the
    # window comes out contiguous in x's own layout (no hidden copies in the conv after it)
    core = None
    if run is not None:
        a, b, k0 = run
        send, core = _HaloSplit.apply(x, dim, torch.cat(send_idx).to(dev), k0, b - a)
    else:
        send = torch.cat([x.index_select(dim, s.to(dev)) for s in send_idx], dim)
    send = send.movedim(dim, 0)
    recv = C.all_to_all_v(send, send_counts, recv_counts, group)
    stats = getattr(_state, "stats", None)
    if stats is not None:
        row = x.element_size() * math.prod(v for k, v in enumerate(x.shape) if k != dim)
        stats.forward += sum(send_counts) * row
        stats.calls += 1
        if recv.requires_grad:
            recv = _CountBackward.apply(recv, stats, sum(recv_counts) * row)
    pool = recv.movedim(0, dim)
    if has_fill:
        shape = list(x.shape)
        shape[dim] = 1
        pool = torch.cat([pool, torch.full(shape, fill, dtype=x.dtype, device=dev)], dim)
    n_local = x.shape[dim]
    if run is not None:
        a, b, k0 = run
        parts = []
        if a:
            parts.append(pool.index_select(dim, (src[:a] - n_local).to(dev)))
        parts.append(core)
        if b < src.numel():
            parts.append(pool.index_select(dim, (src[b:] - n_local).to(dev)))
        out = torch.cat(parts, dim) if len(parts) > 1 else parts[0]
    else:
        out = torch.cat([x, pool], dim).index_select(dim, src.to(dev))
    if recv.requires_grad:
        out = _Join.apply(out, recv)
    return out
