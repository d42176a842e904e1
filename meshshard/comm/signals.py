"""SIGINT and SIGTERM end a rank even while it is blocked inside a collective.

Python runs a signal handler (``KeyboardInterrupt`` for SIGINT, the CLI's handler for both)
only when the main thread gets back to the interpreter. A rank blocked in a collective (gloo's
wait, or a host sync on NCCL's stream) gets back only when the collective returns: at the
collective timeout, 5 minutes by default. A signal whose default action applies (SIGTERM in a
plain script) ends the process at once and needs nothing here.

:func:`end_blocked_on_signal` (installed by :func:`meshshard.comm.init` on a world of more
than one rank) keeps a watcher thread on Python's signal wake-up descriptor. The Python
handlers of SIGINT and SIGTERM are wrapped so the watcher sees when the main thread ran them.
When one has not run ``grace`` seconds after its signal, the main thread is stuck in compiled
code; then:

- with NCCL, the process groups are aborted (the blocked collective raises, the handler runs
  and the program's own clean-up follows), and the watcher waits ``grace`` seconds more;
- otherwise (gloo cannot abort a pending wait), or when that did not help, it writes one line
  naming the signal and where the main thread was, and ends the process with ``128 + signum``
  (130 for SIGINT, 143 for SIGTERM), like the CLI's own exit after an interrupt.

The clean-up of the interrupted step (``finally`` blocks, temporary files) is then skipped:
writers publish atomically, so nothing published is damaged. A handler installed after this
(by the script) is the script's business: the watcher leaves its signals alone.

:func:`sigint_deferred` starts child processes with SIGINT blocked, so a Ctrl-C while they
import does not print their tracebacks (the parent still gets it, right after the start).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

__all__ = ["end_blocked_on_signal", "sigint_deferred"]

DEFAULT_GRACE_S = 2.0

_SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None))
                 if s is not None)
_state: _Watch | None = None


class _Marked:
    """A Python signal handler that counts its runs (in the main thread) before the one it
    wraps runs: the watcher's evidence that the main thread is back in the interpreter."""

    def __init__(self, inner, watch: _Watch) -> None:
        self.inner, self.watch = inner, watch

    def __call__(self, signum, frame):
        self.watch.handled[signum] = self.watch.handled.get(signum, 0) + 1
        if callable(self.inner):
            return self.inner(signum, frame)
        return None


class _Watch:
    def __init__(self, fd_read: int, grace: float) -> None:
        self.fd, self.grace = fd_read, grace
        self.handled: dict[int, int] = {}
        self.seen: dict[int, int] = {}

    def run(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in dict.fromkeys(data):  # a burst of one signal counts once
                if signum in _SIGNALS and isinstance(signal.getsignal(signum), _Marked):
                    self._follow(signum)

    def _follow(self, signum: int) -> None:
        self.seen[signum] = max(self.seen.get(signum, 0) + 1, self.handled.get(signum, 0))
        if self._handled_within(signum, self.grace):
            return
        if _abort_nccl_groups() and self._handled_within(signum, self.grace):
            return
        _end(signum, self.grace)

    def _handled_within(self, signum: int, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.handled.get(signum, 0) >= self.seen[signum]:
                return True
            time.sleep(0.05)
        return self.handled.get(signum, 0) >= self.seen[signum]


def _abort_nccl_groups() -> bool:
    """Abort every process group when NCCL is among the backends (gloo's waits ignore it)."""
    try:
        import torch.distributed as dist

        if not dist.is_initialized() or "nccl" not in str(dist.get_backend()).lower():
            return False
        from torch.distributed import distributed_c10d as c10d

        c10d._abort_process_group()
        return True
    except Exception:  # best effort: the process ends next anyway
        return False


def _where_main_is() -> str:
    """``func (file:line)`` of the main thread's innermost frame, and of the innermost one
    outside torch when that differs (the caller of the collective)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "an unknown place"
    inner = frame
    torch_dir = os.sep + "torch" + os.sep
    outer = None
    f = frame
    while f is not None:
        if torch_dir not in f.f_code.co_filename:
            outer = f
            break
        f = f.f_back

    def show(fr) -> str:
        return f"{fr.f_code.co_name} ({os.path.basename(fr.f_code.co_filename)}:{fr.f_lineno})"

    text = show(inner)
    if outer is not None and outer is not inner:
        text += f", called from {show(outer)}"
    return text


def _end(signum: int, grace: float) -> None:
    name = signal.Signals(signum).name
    who = f"pid {os.getpid()}"
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            who = f"rank {dist.get_rank()}"
    line = (f"meshshard: {name} reached {who} while its main thread was blocked in compiled "
            f"code (a collective?) at {_where_main_is()}; not back after {grace:g} s: ending "
            f"the process (exit {128 + signum})\n")
    # os.write, not logging: the blocked thread may hold a logging lock
    with contextlib.suppress(OSError):
        os.write(2, line.encode(errors="replace"))
    os._exit(128 + signum)


def end_blocked_on_signal(grace: float = DEFAULT_GRACE_S) -> bool:
    """Make SIGINT and SIGTERM end this process within about ``2 * grace`` seconds even when
    its main thread is blocked in a collective (see the module docstring). Call from the main
    thread, after the script's own handlers are installed; idempotent.

    Returns
    -------
    bool
        True when the watcher is in place; False outside the main thread, or when Python's
        signal wake-up descriptor is already used (an asyncio loop).
    """
    global _state
    if _state is not None:
        return True
    if threading.current_thread() is not threading.main_thread() or not _SIGNALS:
        return False
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return False
    if old != -1:  # someone else's (asyncio): keep theirs
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return False
    watch = _Watch(r, grace)
    for s in _SIGNALS:
        h = signal.getsignal(s)
        if callable(h) and not isinstance(h, _Marked):
            signal.signal(s, _Marked(h, watch))
    threading.Thread(target=watch.run, name="meshshard-signal-watch", daemon=True).start()
    _state = watch
    return True


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Start child processes with SIGINT blocked (main thread only), so that children, which
    inherit the mask through ``fork`` and ``exec``, never print a KeyboardInterrupt traceback
    while they import; the parent's own Ctrl-C in that window is not lost: its handler runs
    when the window closes (Python's default raises KeyboardInterrupt). (Ignoring SIGINT
    instead dropped it, and a run whose children started fast then missed a Ctrl-C.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # multiprocessing starts its resource tracker with the first spawn/forkserver child and
    # then *unblocks* SIGINT and SIGTERM (resource_tracker.ensure_running): start it first,
    # or the first child of the process would get an open mask
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    seen: list[int] = []
    # another thread of this process may take the signal: record it there
    saved = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)  # a pending one runs the recorder
        signal.signal(signal.SIGINT, saved)
    if seen and callable(saved):
        saved(signal.SIGINT, None)
    elif seen and saved == signal.SIG_DFL:
        os.kill(os.getpid(), signal.SIGINT)
