"""Run a function on real ``torch.distributed`` ranks spawned on this machine.

Every distributed test (and a few benchmarks) uses :func:`run_ranks`. It starts ``world_size``
processes, joins them into one gloo (CPU) or NCCL (GPU) process group through a TCP store on a
free port (port 0, chosen by the OS), runs ``fn(rank, world_size, *args)`` on each, and returns
the per-rank results in rank order. When any rank raises, the others are stopped after a short
grace period and :class:`RankError` carries every rank's traceback; a rank that hangs is killed
at ``timeout`` seconds. Nothing here mocks the communication layer.

Example
-------
>>> def work(rank, world_size):
...     import torch, torch.distributed as dist
...     t = torch.tensor([rank + 1.0])
...     dist.all_reduce(t)
...     return t.item()
>>> run_ranks(work, 2)  # doctest: +SKIP
[3.0, 3.0]
"""

from __future__ import annotations

import datetime as _dt
import logging
import multiprocessing as _mp
import os
import pickle
import queue as _queue
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["RankError", "run_ranks"]

log = logging.getLogger(__name__)

_GRACE_S = 5.0


class RankError(RuntimeError):
    """One or more ranks failed (raised, crashed or timed out).

    Attributes
    ----------
    failures : dict[int, str]
        rank -> traceback text (or a description of how it died).
    """

    def __init__(self, failures: dict[int, str]):
        self.failures = dict(sorted(failures.items()))
        parts = [f"{len(self.failures)} rank(s) failed: {sorted(self.failures)}"]
        for rank, text in self.failures.items():
            parts.append(f"--- rank {rank} ---\n{text.rstrip()}")
        super().__init__("\n".join(parts))


def _run_exit_finalizers() -> None:
    """What ``os._exit`` skips: multiprocessing's exit finalizers, e.g. unlinking the named
    semaphores this rank made (numcodecs' blosc makes one on first use), which the resource
    tracker otherwise reports as leaked. Run before the result is delivered: the parent may
    kill a rank as soon as it has every result."""
    from multiprocessing import util

    try:
        util._run_finalizers(0)
    except Exception:  # cleanup only
        log.debug("multiprocessing finalizers failed", exc_info=True)


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout_s: float,
    args: Sequence[Any],
    results: Any,
    threads: int,
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            world_size,
            is_master=False,
            timeout=_dt.timedelta(seconds=timeout_s),
        )
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=_dt.timedelta(seconds=timeout_s),
        )
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        out = fn(rank, world_size, *args)
        try:
            payload = pickle.dumps(out)
        except Exception as exc:
            msg = f"result of rank {rank} cannot be pickled: {exc!r}"
            raise TypeError(msg) from exc
        _run_exit_finalizers()
        results.put((rank, True, payload))
        code = 0
    except BaseException:  # every failure must reach the parent
        _run_exit_finalizers()
        results.put((rank, False, traceback.format_exc()))
        code = 1
    # Deliver the result, then leave without tearing the process groups down: with torch
    # 2.13 and gloo, a process holding several groups (DeviceMesh creates them) can abort
    # in its exit-time teardown, and a barrier-based shutdown would hang if another rank
    # failed. The parent owns the lifetime of every rank.
    results.close()
    results.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float = 120.0,
    threads: int = 1,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` freshly spawned ranks.

    Parameters
    ----------
    fn : callable
        A module-level (picklable) function. Its return value must be picklable.
    world_size : int
        Number of ranks (>= 1).
    *args
        Extra picklable arguments passed to every rank.
    backend : str, optional
        ``"gloo"`` (default on CPU) or ``"nccl"`` (default when CUDA has >= world_size devices).
    timeout : float
        Seconds before a silent rank is declared hung and every rank is killed; also the
        process group's collective timeout.
    threads : int
        torch intra-op threads per rank (default 1, so ranks do not oversubscribe cores).

    Returns
    -------
    list
        ``fn``'s return values in rank order.

    Raises
    ------
    RankError
        If any rank raised, died or timed out; carries each failed rank's traceback.
    ValueError
        If ``world_size < 1``.
    """
    if world_size < 1:
        msg = f"world_size={world_size} must be >= 1"
        raise ValueError(msg)
    import torch
    import torch.distributed as dist

    if backend is None:
        use_nccl = torch.cuda.is_available() and torch.cuda.device_count() >= world_size
        backend = "nccl" if use_nccl else "gloo"
    ctx = _mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "numpy", "scipy.spatial"])
    # The parent hosts the rendezvous store on a port the OS chooses (port 0).
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size,
        is_master=True,
        timeout=_dt.timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    port = store.port
    results = ctx.Queue()
    procs = []
    for rank in range(world_size):
        p = ctx.Process(
            target=_worker,
            args=(fn, rank, world_size, port, backend, timeout, args, results, threads),
            daemon=True,
        )
        p.start()
        procs.append(p)

    outputs: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    first_failure_at: float | None = None
    try:
        while len(outputs) + len(failures) < world_size:
            now = time.monotonic()
            if now > deadline:
                break
            if first_failure_at is not None and now > first_failure_at + _GRACE_S:
                break
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except _queue.Empty:
                for rank, p in enumerate(procs):
                    if (
                        not p.is_alive()
                        and rank not in outputs
                        and rank not in failures
                        and p.exitcode not in (0, None)
                    ):
                        # died without reporting (segfault, os._exit, OOM kill)
                        failures[rank] = f"process exited with code {p.exitcode} without a result"
                        first_failure_at = first_failure_at or time.monotonic()
                continue
            if ok:
                outputs[rank] = pickle.loads(payload)
            else:
                failures[rank] = payload
                first_failure_at = first_failure_at or time.monotonic()
        for rank in range(world_size):
            if rank not in outputs and rank not in failures:
                if first_failure_at is not None:
                    failures[rank] = "stopped: another rank failed first (see its traceback)"
                else:
                    failures[rank] = f"timed out after {timeout:.0f} s (hung or too slow)"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)
        results.close()
        del store
    if failures:
        raise RankError(failures)
    return [outputs[r] for r in range(world_size)]
