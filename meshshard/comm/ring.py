"""Point-to-point ring shifts over one process group (the transport of ring attention, run
inside the opaque custom op ``meshshard::ring_attention``, so never traced).

Every rank of a group of ``P`` sends a buffer to its successor (``(r + 1) % P``) and receives
one from its predecessor (``(r - 1) % P``), asynchronously, so the caller can compute while the
buffer travels. Each shift's send and receive are posted together in one
``torch.distributed.batch_isend_irecv`` (one NCCL group): at ``P = 2`` the predecessor and the
successor are the same peer, and NCCL can deadlock on a send and a receive to one peer posted
apart. No tag is used: NCCL matches point-to-point messages by the order they are posted, so
every rank posts its shifts in the same order (the callers' loops are the same on every rank).
Buffer sizes are never assumed: the caller says how many elements it sends and how many it
expects (both sides know every rank's sharding sizes, so they agree), and an empty buffer is
simply not sent (gloo cannot send zero bytes, and both sides skip it alike).

The module counts the bytes it sends (:func:`bytes_sent`, :func:`reset_bytes_sent`) so that
benchmarks report measured, not estimated, communication volume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DoubleBuffer", "Ring", "Shift", "bytes_sent", "reset_bytes_sent"]

_SENT = [0]


def bytes_sent() -> int:
    """Bytes this process has sent through ring shifts since the last reset."""
    return _SENT[0]


def reset_bytes_sent() -> None:
    """Zero the counter of :func:`bytes_sent`."""
    _SENT[0] = 0


@dataclass
class _Pending:
    works: list = field(default_factory=list)
    out: Any = None  # the received tensor (a list for Ring.shifts)
    keep: Any = None  # the send buffers, alive until the sends complete

    def wait(self) -> Any:
        for w in self.works:
            w.wait()
        self.works = []
        return self.out


class DoubleBuffer:
    """Two flat buffers of ``numel`` elements, reused by every shift of every pass: the block
    in hand is computed (or sent) from one while the next is received into the other. One
    allocation per call instead of one per shift keeps the transient memory at two blocks and
    leaves no freed blocks behind to fragment the heap."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        self._bufs = [torch.empty(numel, dtype=dtype, device=device) for _ in range(2)]
        self._i = 0

    def this(self) -> torch.Tensor:
        """The buffer to fill (or holding the block in hand)."""
        return self._bufs[self._i]

    def other(self) -> torch.Tensor:
        """The buffer to receive into; :meth:`swap` after the shift completes."""
        return self._bufs[1 - self._i]

    def swap(self) -> None:
        """Exchange the roles: the received buffer becomes :meth:`this`."""
        self._i = 1 - self._i


class Ring:
    """The ring of one process group (``None`` or a 1-rank group: no communication).

    Parameters
    ----------
    group : ProcessGroup or None
        The group whose ranks form the ring, in group-rank order.
    """

    def __init__(self, group) -> None:
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if self.size == 1 else dist.get_rank(group)
        if self.size > 1:
            self._next = dist.get_global_rank(group, (self.rank + 1) % self.size)
            self._prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def owner(self, step: int) -> int:
        """Group rank whose block this rank holds after ``step`` shifts."""
        return (self.rank - step) % self.size

    def shift(
        self,
        send: torch.Tensor | None,
        recv_numel: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        into: torch.Tensor | None = None,
    ) -> _Pending:
        """Start sending ``send`` (flat; ``None`` or empty: nothing) to the successor and
        receiving ``recv_numel`` elements from the predecessor; ``.wait()`` on the result
        returns the received flat tensor (empty when ``recv_numel`` is 0).

        ``into``: a flat, contiguous buffer of at least ``recv_numel`` elements (not ``send``'s)
        to receive into, so that callers can reuse two buffers instead of allocating one per
        shift; its first ``recv_numel`` elements are returned.

        Collective over the ring: every rank must call it with matching sizes, in the same
        order as its other shifts (messages are matched by post order, not by tag). The send
        and the receive go out in one ``batch_isend_irecv``.
        """
        pending = self.shifts([Shift(send, recv_numel, dtype, device, into)])
        pending.out = pending.out[0]
        return pending

    def shifts(self, items: list[Shift]) -> _Pending:
        """Several shifts (each as :meth:`shift`) posted together in one
        ``batch_isend_irecv``; ``.wait()`` returns the received flat tensors in ``items``'
        order. Messages of one direction are matched in list order, so every rank must pass
        the same list (sizes matching its neighbours'). Collective over the ring."""
        pending = _Pending(out=[])
        ops = []
        keep = []
        for it in items:
            n = int(it.recv_numel)
            buf = (torch.empty(n, dtype=it.dtype, device=it.device) if it.into is None
                   else it.into[:n])
            pending.out.append(buf)
            send = it.send
            if self.size == 1:
                if send is not None and send.numel():
                    buf.copy_(send.reshape(-1))
                continue
            if n:
                ops.append(dist.P2POp(dist.irecv, buf, self._prev, self.group))
            if send is not None and send.numel():
                send = send.reshape(-1).contiguous()
                ops.append(dist.P2POp(dist.isend, send, self._next, self.group))
                _SENT[0] += send.numel() * send.element_size()
                keep.append(send)
        pending.keep = keep
        if ops:
            pending.works.extend(w for w in dist.batch_isend_irecv(ops) if w is not None)
        return pending


@dataclass
class Shift:
    """One shift of :meth:`Ring.shifts`: send ``send`` (flat, or ``None``) to the successor,
    receive ``recv_numel`` elements of ``dtype`` on ``device`` from the predecessor (into
    ``into`` when given)."""

    send: torch.Tensor | None
    recv_numel: int
    dtype: torch.dtype
    device: torch.device
    into: torch.Tensor | None = None
