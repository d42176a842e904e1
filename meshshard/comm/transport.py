"""Two transports for building sharded graphs with one algorithm.

:class:`DistComm` moves numpy arrays between ``torch.distributed`` ranks (one uneven
``all_to_all_single`` per exchange, counts first; :class:`meshshard.comm.host.Comm` underneath).
:class:`ThreadComm` runs the same per-rank code for all P parts inside one process (one thread
per part, a barrier per exchange): the preprocessing path uses it to write every rank's graph
shard, so a stored shard and a shard built on live ranks come from the same code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshshard.comm.host import Comm
from meshshard.comm.rows import collective_flag

__all__ = ["DistComm", "ThreadComm", "run_threads"]


class DistComm(Comm):
    """Exchange numpy arrays between the ranks of a process group (collective methods): the
    graph builder's face of :class:`~meshshard.comm.host.Comm` (same buffers, failures
    named by phase), with the three methods :class:`ThreadComm` also has."""

    def __init__(self, group: Any = None):
        super().__init__(group, what="sharded graph build")
        self.size = self.world

    def exchange(self, parts: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``parts[q]`` goes to rank ``q``; returns what every rank sent here, by source.

        Collective: every rank of the group must call this with arrays of one dtype and the
        same trailing shape.
        """
        send = np.array([int(p.shape[0]) for p in parts], dtype=np.int64)
        got, recv = self.alltoallv(np.concatenate(parts), send)
        bounds = np.concatenate([[0], np.cumsum(recv)])
        return [got[bounds[q] : bounds[q + 1]] for q in range(self.size)]

    def flag(self, problem: str | None, op: str) -> None:
        """Raise on every rank when any rank found a problem. Collective."""
        collective_flag(problem, group=self.group, device=self.device, op=op)

    def allgather_int(self, value: int) -> list[int]:
        """Every rank's integer, in rank order. Collective."""
        return [int(v) for v in self.allgather(np.array([int(value)], dtype=np.int64))[:, 0]]


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
