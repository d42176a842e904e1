"""One rank's bad input stops every rank: a flag and a short message, all-gathered.

A check that fails on one rank only (its slice of a run holds the NaN) must not leave the
other ranks waiting in the next collective until the group's timeout. :func:`raise_together`
is the barrier of such checks: every rank calls it with its finding ('' for none), and every
rank raises when any rank found something -- its own message, or the first bad rank's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.distributed as dist

from meshshard.comm.host import Comm

__all__ = ["raise_together"]

_TEXT = 512


def _world(group: Any) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    if group is not None and hasattr(group, "get_group"):
        group = group.get_group()
    return dist.get_world_size(group)


def raise_together(problem: str, group: Any = None, error: type[Exception] = ValueError) -> None:
    """Raise ``error(problem)`` on every rank of ``group`` (a process group or 1-D DeviceMesh;
    None: the default group) when any rank passes a non-empty ``problem``.

    Collective when the group has more than one rank: one all_gather of 513 bytes per rank.
    """
    if _world(group) == 1:
        if problem:
            raise error(problem)
        return
    comm = Comm(group, what="input check")
    buf = np.zeros(_TEXT + 1, dtype=np.uint8)
    text = problem.encode()[:_TEXT]
    buf[0] = 1 if problem else 0
    buf[1 : 1 + len(text)] = np.frombuffer(text, dtype=np.uint8)
    got = comm.allgather(buf)
    bad = np.flatnonzero(got[:, 0])
    if bad.size:
        if problem:
            raise error(problem)
        first = bytes(got[bad[0], 1:]).rstrip(b"\0").decode(errors="replace")
        raise error(f"(rank {int(bad[0])}) {first}")
