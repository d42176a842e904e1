"""A cap on a preprocessing worker's address space, so that a reader which allocates without
bound (VTK on a hostile file) fails inside its own worker -- a ``MemoryError``, or an abort the
parent reports -- instead of the machine's out-of-memory killer ending other processes.

The budget per worker is ``MESHSHARD_WORKER_MEMORY`` (``"12G"``, ``"800M"``, bytes, or
``"off"``), by default 90% of the memory available when the pool starts, shared by the
workers, and at least 2 GiB. Before each run the worker sets its soft ``RLIMIT_AS`` to what it
maps already, plus the run's input files (they are memory-mapped), plus that budget.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["MEMORY_ENV", "apply_cap", "worker_budget"]

log = logging.getLogger(__name__)

MEMORY_ENV = "MESHSHARD_WORKER_MEMORY"
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_FLOOR = 2 << 30


def _parse(text: str) -> int | None:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    if t in ("OFF", "NONE", "0", ""):
        return None
    scale = _UNITS.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in _UNITS else t
    try:
        value = int(float(number) * scale)
    except ValueError:
        msg = f"{MEMORY_ENV}={text!r}: expected a size such as 12G or 800M, or off"
        raise ValueError(msg) from None
    if value <= 0:
        msg = f"{MEMORY_ENV}={text!r} must be positive (or off)"
        raise ValueError(msg)
    return value


def _available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def worker_budget(workers: int) -> int | None:
    """Bytes each of ``workers`` workers may allocate beyond what it maps (None: no cap)."""
    env = os.environ.get(MEMORY_ENV)
    if env is not None:
        return _parse(env)
    avail = _available()
    if avail is None:
        return None
    return max(_FLOOR, int(0.9 * avail) // max(1, workers))


def _mapped() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def apply_cap(budget: int | None, inputs: list[Path]) -> int | None:
    """Set this process's soft address-space limit for one run; returns it (None: no cap)."""
    import resource

    if budget is None or not hasattr(resource, "RLIMIT_AS"):
        return None
    files = 0
    for p in inputs:
        try:
            files += p.stat().st_size
        except OSError:
            continue
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _mapped() + files + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    log.debug("address space capped at %.1f GiB (%s)", limit / 2**30, MEMORY_ENV)
    return limit
