"""Two transports for building sharded graphs with one algorithm.

:class:`DistComm` moves numpy arrays between ``torch.distributed`` ranks (one uneven
``all_to_all_single`` per exchange, counts first, through :mod:`meshshard.comm.rows`).
:class:`ThreadComm` runs the same per-rank code for all P parts inside one process (one thread
per part, a barrier per exchange): the preprocessing path uses it to write every rank's graph
shard, so a stored shard and a shard built on live ranks come from the same code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshshard.comm.rows import all_gather_rows, all_to_all, collective_flag, exchange_counts

__all__ = ["DistComm", "ThreadComm", "run_threads"]


class DistComm:
    """Exchange numpy arrays between the ranks of a process group (collective methods)."""

    def __init__(self, group: Any = None):
        import torch
        import torch.distributed as dist

        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        # NCCL moves CUDA tensors only; the builder's arrays are staged there and back
        nccl = str(dist.get_backend(group)).lower() == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else None

    def exchange(self, parts: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``parts[q]`` goes to rank ``q``; returns what every rank sent here, by source.

        Collective: every rank of the group must call this with arrays of one dtype and the
        same trailing shape.
        """
        import torch

        send = [int(p.shape[0]) for p in parts]
        dev = self.device or torch.device("cpu")
        recv = exchange_counts(send, self.group, dev)
        flat = torch.from_numpy(np.ascontiguousarray(np.concatenate(parts))).to(dev)
        got = all_to_all(flat, send, recv, self.group).cpu().numpy()
        bounds = np.concatenate([[0], np.cumsum(recv)])
        return [got[bounds[q] : bounds[q + 1]] for q in range(self.size)]

    def flag(self, problem: str | None, op: str) -> None:
        """Raise on every rank when any rank found a problem. Collective."""
        import torch

        dev = self.device or torch.device("cpu")
        collective_flag(problem, group=self.group, device=dev, op=op)

    def allgather_int(self, value: int) -> list[int]:
        """Every rank's integer, in rank order. Collective."""
        import torch

        t = torch.tensor([int(value)], dtype=torch.int64, device=self.device or "cpu")
        return [int(v) for v in all_gather_rows(t, self.group).flatten().tolist()]


class _Secondary(ValueError):
    """Raised on the ranks that saw no problem themselves (another rank did)."""


class _Shared:
    def __init__(self, size: int):
        self.size = size
        self.barrier = threading.Barrier(size)
        self.slots: list[list[Any]] = [[None] * size for _ in range(size)]


class ThreadComm:
    """One simulated rank of :func:`run_threads` (same methods as :class:`DistComm`)."""

    def __init__(self, shared: _Shared, rank: int):
        self._shared = shared
        self.rank = rank
        self.size = shared.size
        self.group = None

    def _all(self, value: Any) -> list[Any]:
        sh = self._shared
        sh.slots[self.rank][0] = value
        sh.barrier.wait()
        out = [sh.slots[q][0] for q in range(self.size)]
        sh.barrier.wait()
        return out

    def exchange(self, parts: Sequence[np.ndarray]) -> list[np.ndarray]:
        sh = self._shared
        for q in range(self.size):
            sh.slots[self.rank][q] = parts[q]
        sh.barrier.wait()
        got = [sh.slots[q][self.rank] for q in range(self.size)]
        sh.barrier.wait()
        return got

    def flag(self, problem: str | None, op: str) -> None:
        problems = self._all(problem)
        if problem is not None:
            raise ValueError(problem)
        bad = [q for q, p in enumerate(problems) if p is not None]
        if bad:
            msg = f"{op}: invalid input on part(s) {bad} (see the error raised there)"
            raise _Secondary(msg)

    def allgather_int(self, value: int) -> list[int]:
        return [int(v) for v in self._all(int(value))]


def run_threads(fn: Callable[[ThreadComm], Any], size: int) -> list[Any]:
    """Run ``fn(comm)`` for ``size`` simulated ranks in threads; results in rank order.

    The first exception (lowest rank) is re-raised; a failing rank breaks the barrier so the
    others stop instead of waiting.
    """
    shared = _Shared(size)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def work(r: int) -> None:
        try:
            results[r] = fn(ThreadComm(shared, r))
        except BaseException as exc:
            errors[r] = exc
            shared.barrier.abort()

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for kinds in ((threading.BrokenBarrierError, _Secondary), (threading.BrokenBarrierError,), ()):
        for e in errors:
            if e is not None and not isinstance(e, kinds):
                raise e
    return results
