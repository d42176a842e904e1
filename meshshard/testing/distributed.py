"""Run a function on real ``torch.distributed`` ranks spawned on this machine.

Every distributed test (and a few benchmarks) uses :func:`run_ranks`. It starts ``world_size``
processes, joins them into one process group (gloo unless the caller names another backend: it
never switches on its own, so the CPU suite tests the same thing on a host with GPUs) through a
TCP store on a free port (port 0, chosen by the OS), runs ``fn(rank, world_size, *args)`` on
each, and returns the per-rank results in rank order. When any rank raises, the others are
stopped after a short grace period and :class:`RankError` carries every rank's traceback; a rank
that hangs is killed at ``timeout`` seconds. Before a rank that is still running is killed, its
Python stack is dumped (``faulthandler``), so the report says per rank: finished, raised, died,
or still running and where -- and names a rank that never arrived at the collective the others
waited in. Collectives fail after the collective timeout (``MESHSHARD_TIMEOUT``, at most
``timeout``), so a diverging rank ends the run with errors rather than a hang. Nothing here
mocks the communication layer.

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
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from meshshard.comm.check import set_debug
from meshshard.comm.process import collective_timeout as _resolve_timeout
from meshshard.comm.process import join_group
from meshshard.comm.signals import sigint_deferred
from meshshard.errors import DistributedError

__all__ = ["RankError", "run_ranks"]

log = logging.getLogger(__name__)

_GRACE_S = 5.0
_DUMP_WAIT_S = 3.0
_STACK_SIGNAL = getattr(signal, "SIGUSR1", None)
# a rank whose stack shows one of these is waiting inside a collective
_COLLECTIVE_MARKERS = ("distributed_c10d.py", os.path.join("comm", "check.py"))


class RankError(DistributedError):
    """One or more ranks failed (raised, crashed, or were still running when stopped).

    Attributes
    ----------
    failures : dict[int, str]
        rank -> traceback text, or how it died, or (still running) why it was stopped and its
        Python stack at that moment.
    status : dict[int, str]
        rank -> ``"finished"``, ``"raised"``, ``"died"`` or ``"running"`` (every rank).
    stuck : list[int]
        Ranks that never arrived: still running outside any ``torch.distributed`` call while
        another rank raised or waited in a collective.
    """

    def __init__(
        self,
        failures: dict[int, str],
        status: dict[int, str] | None = None,
        stuck: Sequence[int] = (),
    ):
        self.failures = dict(sorted(failures.items()))
        self.status = dict(sorted((status or {r: "raised" for r in failures}).items()))
        self.stuck = sorted(stuck)
        head = f"{len(self.failures)} rank(s) failed: {sorted(self.failures)}"
        if self.stuck:
            head += (
                f"; rank(s) {self.stuck} never arrived (still running outside any collective "
                "while the others failed or waited in one)"
            )
        parts = [head, "  " + ", ".join(f"rank {r}: {s}" for r, s in self.status.items())]
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


def _dump_stack_on_signal(path: str) -> None:
    """On ``_STACK_SIGNAL``, write every thread's Python stack to ``path`` (works while the
    rank is blocked inside a C++ collective)."""
    import faulthandler

    if _STACK_SIGNAL is None:
        return
    fh = open(path, "w")  # kept open for the life of the rank
    faulthandler.register(_STACK_SIGNAL, file=fh, all_threads=True)
    global _STACK_FILE
    _STACK_FILE = fh


_STACK_FILE = None


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout_s: float,
    pg_timeout_s: float,
    args: Sequence[Any],
    results: Any,
    threads: int,
    env: Mapping[str, str],
    stack_path: str,
) -> None:
    os.environ.update(env)
    _dump_stack_on_signal(stack_path)
    import torch

    set_debug(None)  # MESHSHARD_DEBUG_COLLECTIVES from ``env``
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        if "nccl" in backend:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        join_group(backend, "127.0.0.1", port, rank, world_size,
                   join_timeout=_dt.timedelta(seconds=timeout_s),
                   timeout=_dt.timedelta(seconds=pg_timeout_s))
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


# Imported once by the forkserver (at its start, in this process's first call), so that every
# rank forked from it starts with them: importing meshshard's core in each rank cost ~2-3 s of
# CPU per rank, most of a short distributed test. meshshard's modules read no environment
# variable at import time, so a rank's ``env`` still applies to them; torch's inductor config
# (imported by the core) reads ``TORCHINDUCTOR_*`` at import, so a rank changes those through
# ``torch._inductor.config`` (its cache directory, read at use, may still be set in ``env``).
# A module that fails to import here is skipped by multiprocessing; the rank imports it.
_PRELOAD = ["torch", "torch.distributed", "numpy", "scipy.spatial", "meshshard.testing.distributed",
            "meshshard.shardtensor", "meshshard.ops", "meshshard.graph", "meshshard.models",
            "meshshard.parallel"]


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 120.0,
    threads: int = 1,
    collective_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` freshly spawned ranks.

    The ranks are forked from a forkserver that imports torch and meshshard's core once per
    process (at the first call), so a rank starts in a fraction of a second.

    Parameters
    ----------
    fn : callable
        A module-level (picklable) function. Its return value must be picklable.
    world_size : int
        Number of ranks (>= 1).
    *args
        Extra picklable arguments passed to every rank.
    backend : str
        ``"gloo"`` (default, whatever devices the host has) or ``"nccl"`` (each rank then
        takes GPU ``rank % device_count``; tests that ask for it carry the ``gpu`` marker),
        or a device-mapped string such as ``"cpu:gloo,cuda:nccl"``.
    timeout : float
        Seconds before a silent rank is declared hung and every rank is killed.
    threads : int
        torch intra-op threads per rank (default 1, so ranks do not oversubscribe cores).
    collective_timeout : float, optional
        Seconds a collective waits for the other ranks before it raises (every group the
        ranks create). Default: ``MESHSHARD_TIMEOUT`` (from ``env``, else this process's
        environment), else 5 minutes; never more than ``timeout``.
    env : mapping of str to str, optional
        Environment variables set in every rank before the process group is made, e.g.
        ``{"MESHSHARD_DEBUG_COLLECTIVES": "1"}``.

    Returns
    -------
    list
        ``fn``'s return values in rank order.

    Raises
    ------
    RankError
        If any rank raised, died or was still running when stopped; carries each failed
        rank's traceback or stack, and names the ranks that never arrived
        (:attr:`RankError.stuck`).
    ValueError
        If ``world_size < 1``, or the collective timeout is not a positive number.
    """
    if world_size < 1:
        msg = f"world_size={world_size} must be >= 1"
        raise ValueError(msg)
    import torch.distributed as dist

    env = {str(k): str(v) for k, v in (env or {}).items()}
    pg_timeout = min(
        _resolve_timeout(collective_timeout, environ={**os.environ, **env}).total_seconds(),
        float(timeout),
    )

    ctx = _mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
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
    stack_dir = tempfile.mkdtemp(prefix="meshshard-ranks-")
    stack_paths = [os.path.join(stack_dir, f"rank{r}.txt") for r in range(world_size)]
    procs: list[Any] = []
    outputs: dict[int, Any] = {}
    failures: dict[int, str] = {}
    status: dict[int, str] = {}
    stuck: list[int] = []
    first_failure_at: float | None = None
    try:
        # Ctrl-C reaches the whole process group: the forkserver (possibly still importing
        # torch) and the ranks would each print a KeyboardInterrupt traceback. They start with
        # SIGINT blocked; a Ctrl-C during the start is kept and raised here right after it,
        # and the parent, which gets the KeyboardInterrupt, stops them below.
        with sigint_deferred():
            for rank in range(world_size):
                p = ctx.Process(
                    target=_worker,
                    args=(fn, rank, world_size, port, backend, timeout, pg_timeout, args,
                          results, threads, env, stack_paths[rank]),
                    daemon=True,
                )  # fmt: skip
                p.start()
                procs.append(p)
        deadline = time.monotonic() + timeout
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
                        status[rank] = "died"
                        first_failure_at = first_failure_at or time.monotonic()
                continue
            if ok:
                outputs[rank] = pickle.loads(payload)
                status[rank] = "finished"
            else:
                failures[rank] = payload
                status[rank] = "raised"
                first_failure_at = first_failure_at or time.monotonic()
        pending = [r for r in range(world_size) if r not in outputs and r not in failures]
        if pending:
            stacks = _dump_stacks(procs, pending, stack_paths)
            if first_failure_at is not None:
                failed = sorted(failures)
                why = f"still running {_GRACE_S:.0f} s after rank(s) {failed} failed; stopped"
            else:
                why = f"timed out after {timeout:.0f} s (hung or too slow)"
            in_collective = {r for r in pending if _in_collective(stacks.get(r, ""))}
            raised = any(status.get(r) == "raised" for r in failures)
            for rank in pending:
                status[rank] = "running"
                stack = stacks.get(rank, "")
                if rank in in_collective:
                    where = "waiting inside a collective"
                elif stack and (raised or in_collective):
                    where = ("NEVER ARRIVED: not inside any torch.distributed call while the "
                             "others failed or waited in one")
                    stuck.append(rank)
                else:
                    where = "not inside a torch.distributed call" if stack else "no stack"
                text = f"{why}; {where}"
                if stack:
                    text += f"; its Python stack when stopped:\n{stack}"
                failures[rank] = text
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)
        results.close()
        del store
        shutil.rmtree(stack_dir, ignore_errors=True)
    if failures:
        raise RankError(failures, status, stuck)
    return [outputs[r] for r in range(world_size)]


def _dump_stacks(
    procs: Sequence[Any], ranks: Sequence[int], paths: Sequence[str]
) -> dict[int, str]:
    """Ask each still-running rank for its Python stack (faulthandler, see
    :func:`_dump_stack_on_signal`); return what arrived within a few seconds."""
    if _STACK_SIGNAL is None:
        return {}
    asked = []
    for r in ranks:
        if procs[r].is_alive() and procs[r].pid is not None:
            try:
                os.kill(procs[r].pid, _STACK_SIGNAL)
                asked.append(r)
            except OSError:
                continue
    out: dict[int, str] = {}
    until = time.monotonic() + _DUMP_WAIT_S
    while asked and time.monotonic() < until:
        time.sleep(0.1)
        sizes = {r: _size(paths[r]) for r in asked}
        if all(sizes.values()):
            time.sleep(0.2)  # the dump is written in one go; let it finish
            break
    for r in asked:
        try:
            with open(paths[r], errors="replace") as fh:
                text = fh.read().strip()
        except OSError:
            text = ""
        if text:
            out[r] = _trim_stack(text)
    return out


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _trim_stack(text: str) -> str:
    """Drop the harness' own frames (multiprocessing start-up and ``_worker``)."""
    keep = [
        ln for ln in text.splitlines()
        if not any(m in ln for m in ("multiprocessing/", "testing/distributed.py", '"<'))
    ]
    return "\n".join(keep)


def _in_collective(stack: str) -> bool:
    return any(m in stack for m in _COLLECTIVE_MARKERS)
