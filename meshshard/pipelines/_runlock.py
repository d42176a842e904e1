"""One writer per run: an advisory lock held while a run's store is written.

``DST/run_<i>.zarr.lock`` is locked with ``flock`` for as long as a process writes
``run_<i>.zarr`` (its ``.tmp-<pid>`` temporary included). The kernel drops the lock when the
holder dies, however it dies, so:

- a live writer's temporary store is never taken for a crash's leftover: another run (a rerun
  started while an orphaned worker still writes, a second invocation on the same DST) finds the
  lock held and reports the run busy instead of deleting anything;
- whoever holds the lock may remove every temporary of that run: their owners are dead.

The holder removes the lock file before releasing it; a waiter checks after locking that the
path still names the file it locked (the usual unlink-safe pattern). A lock file left by a
crash is harmless and removed by the next holder. Where ``flock`` is not supported (some
network file systems) the lock is skipped with a warning and the old rule applies: a run's
temporaries are removed as stale when it starts.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from meshshard.errors import DistributedError

__all__ = ["RunBusy", "run_lock"]

log = logging.getLogger(__name__)

_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_warned = False


class RunBusy(DistributedError):
    """Another live process is writing this run's store."""


def lock_path(dst: Path, name: str) -> Path:
    return dst / f"{name}.zarr.lock"


@contextmanager
def run_lock(dst: str | Path, name: str) -> Iterator[bool]:
    """Hold the write lock of ``dst/<name>.zarr`` (yields False where locking is unsupported).

    Raises
    ------
    RunBusy
        Another live process holds it; the message names that process.
    """
    fd = _acquire(lock_path(Path(dst), name), f"{Path(dst) / name}.zarr")
    try:
        yield fd is not None
    finally:
        if fd is not None:
            try:
                os.unlink(lock_path(Path(dst), name))
            except FileNotFoundError:
                pass
            os.close(fd)  # releases the lock


def _acquire(path: Path, store: str) -> int | None:
    global _warned
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            msg = (
                f"{store} is being written by another live process ({owner}); let it finish "
                f"or stop it, then run again"
            )
            raise RunBusy(msg) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _UNSUPPORTED:
                raise
            if not _warned:
                log.warning("%s: no file locking here (%s); runs are not locked", path, exc)
                _warned = True
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed it between our open and lock: lock the new one
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd
