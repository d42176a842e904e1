"""Worker processes that fail alone, die with their parent and stop within seconds.

``concurrent.futures.ProcessPoolExecutor`` is the wrong tool for readers that can crash the
process (a segfault or ``abort`` inside VTK, the out-of-memory killer): one dead worker breaks
the pool (``BrokenProcessPool``) and every pending task is lost, its ``shutdown`` can wait for
idle workers long after Ctrl-C, and its workers outlive a parent killed with SIGKILL.
:class:`WorkerPool` keeps ``n`` long-lived ``spawn`` processes, gives each one task at a time
over a pipe, and watches both the pipe and the process:

- a worker that dies fails only the task it held (:class:`WorkerDied` says how it died) and is
  replaced while tasks remain;
- workers ask the kernel to SIGKILL them when their parent dies (``PR_SET_PDEATHSIG`` on Linux,
  a thread polling the parent pid elsewhere) and exit when their pipe closes;
- workers ignore SIGINT: a terminal's Ctrl-C reaches the whole process group and the parent
  decides. They start with SIGINT blocked until they ignore it, so one that is still importing
  prints no traceback. When the parent leaves the pool with an exception (an interrupt
  included) it sends SIGTERM, waits ``grace`` seconds, then SIGKILLs; a second Ctrl-C cannot
  cut that clean-up short. ``on_exit(pid)`` is then called for every worker that did not end
  normally, so the caller can remove what it left behind.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from meshshard.comm.signals import sigint_deferred
from meshshard.errors import DistributedError

__all__ = ["WorkerDied", "WorkerPool", "describe_exit", "die_with_parent"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_SIGNAL_HINTS = {
    "SIGSEGV": "a crash inside compiled code, e.g. a reader given a damaged file",
    "SIGBUS": "a crash inside compiled code, or a file truncated while mapped",
    "SIGABRT": "aborted, e.g. std::bad_alloc inside VTK or os.abort()",
    "SIGKILL": "killed from outside; often the out-of-memory killer (see `dmesg`)",
    "SIGFPE": "an arithmetic fault inside compiled code",
    "SIGILL": "an illegal instruction inside compiled code",
    "SIGTERM": "terminated from outside",
}


@dataclass(frozen=True)
class WorkerDied:
    """Stands in for the result of a task whose worker process died while holding it."""

    pid: int
    exitcode: int | None
    seconds: float

    @property
    def message(self) -> str:
        return describe_exit(self.pid, self.exitcode)


def describe_exit(pid: int, exitcode: int | None) -> str:
    """``"the worker process (pid 12) died from SIGSEGV (a crash inside ...)"``."""
    if exitcode is None:
        return f"the worker process (pid {pid}) stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = _SIGNAL_HINTS.get(name)
        return f"the worker process (pid {pid}) died from {name}" + (f" ({hint})" if hint else "")
    return f"the worker process (pid {pid}) exited with status {exitcode}"


def die_with_parent(parent_pid: int) -> bool:
    """Make this process end when ``parent_pid`` (its parent) ends.

    On Linux the kernel sends SIGKILL when the parent dies (``PR_SET_PDEATHSIG``); elsewhere a
    daemon thread polls the parent pid twice a second. Exits at once if the parent is already
    gone. Returns True when the kernel mechanism is in place.
    """
    ok = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            ok = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            ok = False
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
    if not ok:
        threading.Thread(
            target=_watch_parent, args=(parent_pid,), daemon=True, name="meshshard-parent-watch"
        ).start()
    return ok


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(1)


def _worker_main(conn, parent_pid: int, initializer: Callable | None, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # started with SIGINT blocked (sigint_deferred): now ignored, so a Ctrl-C that arrived
    # while it imported is dropped, and what it starts inherits no blocked mask
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent_pid)
    if initializer is not None:
        initializer(*initargs)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        fn, args = task
        try:
            out = (True, fn(*args))
        except BaseException as exc:  # reported to the parent; the worker goes on
            out = (False, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(out)
        except OSError:
            return


class TaskError(DistributedError):
    """A task raised in its worker; the message is ``"ExceptionType: text"``."""


class _Worker:
    def __init__(self, ctx, initializer: Callable | None, initargs: tuple) -> None:
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=_worker_main,
            args=(child_conn, os.getpid(), initializer, initargs),
            daemon=False,  # a task may start processes of its own; close() ends workers
            name="meshshard-worker",
        )
        with sigint_deferred():  # a Ctrl-C while it imports: no traceback from it
            self.proc.start()
        child_conn.close()
        self.conn = parent_conn
        self.task: int | None = None
        self.started = 0.0


class WorkerPool:
    """``n`` worker processes, one task each at a time; use as a context manager.

    Parameters
    ----------
    n : int
        Most processes alive at once (started when needed).
    initializer, initargs
        Called once in every worker before its first task (picklable, module level).
    grace : float
        Seconds between SIGTERM and SIGKILL when the pool is left with an exception.
    on_exit : callable, optional
        ``on_exit(pid)`` for every worker that died or was killed, after it is reaped.
    """

    def __init__(
        self,
        n: int,
        *,
        initializer: Callable | None = None,
        initargs: tuple = (),
        grace: float = 3.0,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        import multiprocessing as mp

        if n < 1:
            msg = f"n={n} worker processes: must be >= 1"
            raise ValueError(msg)
        self.n = n
        self._ctx = mp.get_context("spawn")
        self._init = (initializer, initargs)
        self.grace = grace
        self.on_exit = on_exit
        self._workers: list[_Worker] = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(kill=exc_type is not None)

    def imap_unordered(self, fn: Callable, tasks: Iterable[tuple]) -> Iterator[tuple[int, Any]]:
        """Yield ``(i, fn(*tasks[i]))`` as tasks finish; the result is a :class:`WorkerDied`
        when the worker died holding the task, or a :class:`TaskError` when ``fn`` raised."""
        from multiprocessing.connection import wait

        pending = deque(enumerate(tasks))
        while pending or any(w.task is not None for w in self._workers):
            for w in [w for w in self._workers if w.task is None and not w.proc.is_alive()]:
                self._reap(w)  # died while idle (killed from outside): replace it
            for w in self._workers:
                if w.task is None and pending:
                    self._give(w, fn, pending.popleft())
            while pending and len(self._workers) < self.n:
                w = _Worker(self._ctx, *self._init)
                self._workers.append(w)
                self._give(w, fn, pending.popleft())
            busy = [w for w in self._workers if w.task is not None]
            ready = set(wait([w.conn for w in busy] + [w.proc.sentinel for w in busy]))
            for w in busy:
                if w.conn in ready or w.proc.sentinel in ready:
                    got = self._collect(w)
                    if got is not None:
                        yield got

    def _give(self, w: _Worker, fn: Callable, item: tuple[int, tuple]) -> None:
        i, args = item
        w.task, w.started = i, time.perf_counter()
        try:
            w.conn.send((fn, args))
        except OSError:
            pass  # it died already: the sentinel reports it

    def _collect(self, w: _Worker) -> tuple[int, Any] | None:
        i = w.task
        try:
            if w.conn.poll():
                ok, value = w.conn.recv()
                w.task = None
                return i, value if ok else TaskError(value)
        except (EOFError, OSError):
            pass
        if w.proc.is_alive():
            w.proc.join(1.0)  # its pipe closed: it is on its way out
            if w.proc.is_alive():
                return None
        self._reap(w)
        return i, WorkerDied(w.proc.pid, w.proc.exitcode, time.perf_counter() - w.started)

    def _reap(self, w: _Worker) -> None:
        w.proc.join()
        self._workers.remove(w)
        w.conn.close()
        log.info("%s", describe_exit(w.proc.pid, w.proc.exitcode))  # the caller reports it
        self._exited(w)

    def _exited(self, w: _Worker) -> None:
        if self.on_exit is not None:
            try:
                self.on_exit(w.proc.pid)
            except Exception:  # clean-up is best effort; a rerun cleans what is left
                log.exception("clean-up after worker %d failed", w.proc.pid)

    def close(self, kill: bool = False) -> None:
        """Stop every worker: ask idle ones to exit (``kill=False``), or SIGTERM, wait
        ``grace`` s and SIGKILL; SIGINT/SIGTERM that arrive meanwhile are deferred."""
        with _deferred_interrupts():
            workers, self._workers = self._workers, []
            if not kill:
                for w in workers:
                    try:
                        w.conn.send(None)
                    except OSError:
                        pass
                deadline = time.monotonic() + 30.0
                for w in workers:
                    w.proc.join(max(0.0, deadline - time.monotonic()))
            for w in workers:
                if w.proc.is_alive():
                    w.proc.terminate()
            deadline = time.monotonic() + self.grace
            for w in workers:
                w.proc.join(max(0.0, deadline - time.monotonic()))
            for w in workers:
                if w.proc.is_alive():
                    w.proc.kill()
                    w.proc.join(10.0)
            for w in workers:
                w.conn.close()
                if w.proc.exitcode != 0:
                    self._exited(w)


class _deferred_interrupts:
    """Hold SIGINT/SIGTERM handlers off during clean-up (main thread only); a signal that
    arrives meanwhile is logged and dropped: the clean-up is bounded and the caller is already
    on its way out."""

    def __enter__(self):
        self._saved = {}
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._saved[s] = signal.signal(s, self._note)
            except (ValueError, OSError):
                pass
        return self

    @staticmethod
    def _note(signum, frame) -> None:
        log.warning("%s: already stopping the workers", signal.Signals(signum).name)

    def __exit__(self, *exc) -> None:
        for s, h in self._saved.items():
            signal.signal(s, h)
