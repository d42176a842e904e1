"""Small numpy-in, numpy-out wrappers over ``torch.distributed`` collectives for the
distributed partitioner (:mod:`meshshard.partition.distributed` communicates only through
them).

Every wrapper is a collective: every rank of ``group`` must call it in the same order. Buffers
travel on ``device`` (CPU for gloo, the CUDA device for NCCL); arrays come back on the host.
A failed collective (a peer raised, died or timed out) is re-raised as :class:`ExchangeError`
naming the phase, so every surviving rank ends with a clear message instead of hanging.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from meshshard.comm.rows import _all_gather_single, a2a_into, exchange_counts
from meshshard.errors import DistributedError

__all__ = ["Comm", "ExchangeError"]



class ExchangeError(DistributedError):
    """A collective of the distributed partitioner failed on this rank (another rank raised,
    died or timed out)."""


class Comm:
    """The group, rank, world size and buffer device of one distributed call."""

    def __init__(self, group: Any = None, device: torch.device | None = None, what: str = ""):
        if not dist.is_available() or not dist.is_initialized():
            msg = (
                f"{what or 'this function'} needs an initialised process group: call "
                "torch.distributed.init_process_group (torchrun sets the environment)"
            )
            raise RuntimeError(msg)
        if group is not None and hasattr(group, "get_group"):  # a 1-D DeviceMesh
            if getattr(group, "ndim", 1) != 1:
                msg = f"pass a 1-D DeviceMesh or a process group, got a {group.ndim}-D mesh"
                raise ValueError(msg)
            group = group.get_group()
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        # NCCL exchanges device buffers (the points' device, else the current CUDA device);
        # gloo and the others exchange host buffers
        if dist.get_backend(group) == "nccl":
            if device is None or device.type != "cuda":
                device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        self.device = device
        self.what = what
        self._phase = "start"
        self._t_phase = time.perf_counter()
        self.phase_seconds: dict[str, float] = {}  # phase -> wall seconds (compute + waits)
        self.bytes: dict[str, int] = {}  # phase -> bytes this rank sent + received
        self.peak_buffer = 0  # largest send + receive buffer pair of one collective
        self.seconds: dict[str, float] = {}  # phase -> wall seconds inside collectives

    @property
    def phase(self) -> str:
        """The current phase: names errors and keys the byte, time and phase counters."""
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        now = time.perf_counter()
        done = self._phase
        self.phase_seconds[done] = self.phase_seconds.get(done, 0.0) + now - self._t_phase
        self._phase, self._t_phase = name, now

    def _count(self, sent: int, received: int, t0: float) -> None:
        self.bytes[self.phase] = self.bytes.get(self.phase, 0) + sent + received
        self.peak_buffer = max(self.peak_buffer, sent + received)
        dt = time.perf_counter() - t0
        self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + dt

    # -- helpers -------------------------------------------------------------------------
    def _t(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t if self.device.type == "cpu" else t.to(self.device)

    @staticmethod
    def _np(t: torch.Tensor) -> np.ndarray:
        return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()

    def _fail(self, exc: BaseException) -> ExchangeError:
        msg = (
            f"{self.what}: collective in phase {self.phase!r} failed on rank {self.rank} of "
            f"{self.world} (another rank raised, died or timed out): {exc}"
        )
        return ExchangeError(msg)

    # -- collectives ---------------------------------------------------------------------
    def allreduce(self, a: np.ndarray, op: str = "sum") -> np.ndarray:
        """Element-wise sum / min / max over ranks (collective)."""
        t = self._t(np.array(a, copy=True))
        red = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
        t0 = time.perf_counter()
        try:
            dist.all_reduce(t, op=red, group=self.group)
        except (RuntimeError, ValueError) as exc:
            raise self._fail(exc) from exc
        self._count(t.nbytes, t.nbytes, t0)
        return self._np(t)

    def allgather(self, a: np.ndarray) -> np.ndarray:
        """Stack of every rank's same-shaped ``a``, shape (world, *a.shape) (collective)."""
        a = np.ascontiguousarray(a)
        t = self._t(a.reshape(-1))
        out = torch.empty(self.world * t.numel(), dtype=t.dtype, device=t.device)
        t0 = time.perf_counter()
        try:
            _all_gather_single(out, t, group=self.group)
        except (RuntimeError, ValueError) as exc:
            raise self._fail(exc) from exc
        self._count(t.nbytes, out.nbytes, t0)
        return self._np(out).reshape(self.world, *a.shape)

    def allgatherv(self, a: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``a`` (any number of rows, same trailing shape) (collective)."""
        counts = self.allgather(np.array([a.shape[0]], dtype=np.int64))[:, 0]
        top = int(counts.max()) if counts.size else 0
        buf = np.zeros((top, *a.shape[1:]), dtype=a.dtype)
        buf[: a.shape[0]] = a
        allv = self.allgather(buf)
        return [allv[r, : int(counts[r])] for r in range(self.world)]

    def alltoallv(
        self, a: np.ndarray, send_counts: np.ndarray, recv_counts: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``a[sum(send_counts[:r]) : ...]`` go to rank ``r``; returns the received rows
        (grouped by source rank, in rank order) and the receive counts (collective)."""
        send_counts = np.asarray(send_counts, dtype=np.int64)
        if recv_counts is None:  # the counts exchange first, then the copy to the buffer device
            recv_counts = self.alltoall_counts(send_counts)
        out, recv_counts = self.alltoallv_tensor(self._t(a), send_counts, recv_counts)
        return self._np(out), recv_counts

    def alltoallv_tensor(
        self, t: torch.Tensor, send_counts: np.ndarray, recv_counts: np.ndarray | None = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """:meth:`alltoallv` of a tensor, without numpy: the result stays a tensor on the
        buffer device (the tensor moves there first if it is elsewhere) (collective)."""
        send_counts = np.asarray(send_counts, dtype=np.int64)
        if recv_counts is None:
            recv_counts = self.alltoall_counts(send_counts)
        t = t.contiguous().to(self.device)
        out = torch.empty((int(recv_counts.sum()), *t.shape[1:]), dtype=t.dtype, device=t.device)
        t0 = time.perf_counter()
        try:
            a2a_into(out, t, send_counts.tolist(), recv_counts.tolist(), self.group)
        except (RuntimeError, ValueError) as exc:
            raise self._fail(exc) from exc
        self._count(t.nbytes, out.nbytes, t0)
        return out, recv_counts

    def alltoall_counts(self, send_counts: np.ndarray) -> np.ndarray:
        """How many rows every rank sends to this one (collective)."""
        try:
            got = exchange_counts(np.asarray(send_counts, dtype=np.int64), self.group,
                                  self.device)
        except (RuntimeError, ValueError) as exc:
            raise self._fail(exc) from exc
        return np.asarray(got, dtype=np.int64)
