"""What the launcher (torchrun, or SLURM through it) told this process: the one reader of
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``.

Part of the communication room with :mod:`meshshard.comm.process` (which makes the process
groups) and :mod:`meshshard.comm.check`; it imports nothing heavy, so the CLI can ask
"which rank am I?" before torch is loaded. No collective.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from meshshard.errors import InputError

__all__ = ["Launch", "launch"]


@dataclass(frozen=True)
class Launch:
    """This process's place in the job (a world of one when not launched as a rank)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launched: bool = False  # RANK is set: a launcher started this process as one rank
    rendezvous: bool = False  # MASTER_ADDR and MASTER_PORT are set too: a group can be joined

    def label(self) -> str:
        """`` [rank 2/8]`` when there are several ranks, else ``""``."""
        return f" [rank {self.rank}/{self.world_size}]" if self.world_size > 1 else ""


def launch(environ: Mapping[str, str] | None = None) -> Launch:
    """Read the launcher's variables (default ``os.environ``).

    Raises
    ------
    InputError
        ``RANK``, ``WORLD_SIZE`` or ``LOCAL_RANK`` set but not integers, or a rank outside
        ``[0, WORLD_SIZE)``.
    """
    env = os.environ if environ is None else environ

    def number(name: str, default: int) -> int:
        raw = env.get(name, "").strip()
        if not raw:
            return default
        try:
            return int(raw)
        except ValueError:
            msg = f"{name}={raw!r} must be an integer (it is set by torchrun)"
            raise InputError(msg) from None

    rank, world = number("RANK", 0), number("WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world:
        msg = f"RANK={rank} must be in [0, WORLD_SIZE={world})"
        raise InputError(msg)
    return Launch(rank=rank, world_size=world, local_rank=number("LOCAL_RANK", 0),
                  launched=bool(env.get("RANK", "").strip()),
                  rendezvous=bool(env.get("MASTER_ADDR") and env.get("MASTER_PORT")))
