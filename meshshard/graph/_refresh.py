"""The ghost refresh of a ShardedGraph as one autograd Function, without full-size temporaries.

:func:`meshshard.ops.halo_exchange` (general halo plans) returns ``cat([x, a2a(x[send])])``;
its backward builds a zero tensor of ``x``'s size for the indexing gradient and then adds it to
the slice of the incoming gradient: three full-size passes over the owned rows per refresh.
Here the forward copies the owned rows once and receives the ghosts straight into the output;
the backward clones the owned rows' gradient once and adds the returned ghost gradients to the
sent rows in place (``index_add_``). Same values, same order, same collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from meshshard.comm.resident import cached_on_device
from meshshard.comm.rows import a2a_into as _a2a_into

__all__ = ["refresh_owned", "send_index"]


def _forward(owned: torch.Tensor, send_idx: torch.Tensor, send: list[int], recv: list[int],
             group: Any) -> torch.Tensor:  # fmt: skip
    n = owned.shape[0]
    out = owned.new_empty((n + sum(recv), *owned.shape[1:]))
    out[:n].copy_(owned)
    _a2a_into(out[n:], owned.index_select(0, send_idx), send, recv, group)
    return out


class _Refresh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, owned, send_idx, send, recv, group):  # type: ignore[override]
        ctx.save_for_backward(send_idx)
        ctx.meta = (owned.shape[0], send, recv, group)
        return _forward(owned, send_idx, send, recv, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (send_idx,) = ctx.saved_tensors
        n, send, recv, group = ctx.meta
        grad = grad.contiguous()
        back = grad.new_empty((sum(send), *grad.shape[1:]))
        _a2a_into(back, grad[n:], recv, send, group)
        g_owned = grad[:n].clone()
        g_owned.index_add_(0, send_idx, back)
        return g_owned, None, None, None, None


def send_index(plan: Any, rank: int, device: torch.device | str) -> torch.Tensor:
    """This rank's sent rows of ``plan`` on ``device``: copied from the host once per (plan,
    device) and kept (a plug stages it at construction, outside the step)."""
    return cached_on_device(plan, ("send_idx", rank), device,
                            lambda: np.asarray(plan.send_idx[rank], dtype=np.int64))


def refresh_owned(owned: torch.Tensor, plan: Any, rank: int, group: Any) -> torch.Tensor:
    """``owned`` rows then the ghost rows routed by ``plan`` (this rank's view of a HaloPlan).

    Collective: every rank of ``group`` must call this (and ``backward`` when gradients flow).
    Differentiable: ghost gradients are summed into the rows that were sent.
    """
    send_idx = send_index(plan, rank, owned.device)  # once per device
    send = [int(c) for c in plan.send_counts(rank)]
    recv = [int(c) for c in plan.recv_counts(rank)]
    owned = owned.contiguous()
    if owned.requires_grad and torch.is_grad_enabled():
        return _Refresh.apply(owned, send_idx, send, recv, group)
    return _forward(owned, send_idx, send, recv, group)
