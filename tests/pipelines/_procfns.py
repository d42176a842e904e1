"""Task functions for the WorkerPool tests (importable by spawned workers)."""

from __future__ import annotations

import os
import signal
import time


def square_or_die(i: int) -> int:
    if i == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
    if i == 2:
        raise SystemExit("not an Exception")
    return i * i


def pid_then_sleep(i: int) -> int:
    time.sleep(600)
    return i
