"""The communication room: the only code that reads torchrun's variables, creates process
groups or calls the raw uneven all-to-all. Every other room communicates through it.

- :mod:`~meshshard.comm.launch`: RANK / WORLD_SIZE / LOCAL_RANK, read once (no torch import).
- :mod:`~meshshard.comm.process`: :func:`init` (meshshard's collective timeout on every
  group), :func:`shutdown`, :func:`~meshshard.comm.process.join_group` (the test ranks).
- :mod:`~meshshard.comm.check`: the collective checker (``MESHSHARD_DEBUG_COLLECTIVES``).
- :mod:`~meshshard.comm.signals`: SIGINT/SIGTERM end a rank blocked in a collective within
  seconds; child processes start with SIGINT deferred.
- :mod:`~meshshard.comm.rows`: rows between ranks, plain and differentiable; counts; small
  gathers; the agreement flag that raises on every rank.
- :mod:`~meshshard.comm.ring`: point-to-point ring shifts (the transport of ring attention).
- :mod:`~meshshard.comm.host` and :mod:`~meshshard.comm.transport`: numpy in, numpy out, for
  the distributed partitioner and the graph builder (which also runs its ranks as threads).

The ShardTensor core's traced collectives (``shardtensor/_aten/collective_ops.py``) are
still in the core: they are custom ops for the compiler's room.

Attributes load on first use, so ``import meshshard.comm.launch`` (the CLI) pulls no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CollectiveMismatchError",
    "CollectiveWaitError",
    "check_collective",
    "collective_timeout",
    "default_backend",
    "default_device",
    "end_blocked_on_signal",
    "init",
    "launch",
    "set_debug",
    "shutdown",
]

_WHERE = {
    "CollectiveMismatchError": "check",
    "CollectiveWaitError": "check",
    "check_collective": "check",
    "set_debug": "check",
    "collective_timeout": "process",
    "default_backend": "process",
    "default_device": "process",
    "end_blocked_on_signal": "signals",
    "init": "process",
    "shutdown": "process",
    "launch": "launch",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"meshshard.comm.{_WHERE[name]}"), name)
    msg = f"module 'meshshard.comm' has no attribute {name!r}"
    raise AttributeError(msg)
