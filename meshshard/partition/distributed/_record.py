"""This rank's piece of a distributed partition: :class:`DistributedPartition`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["DistributedPartition", "owner_counts", "part_owners"]


def part_owners(parts: int, world: int) -> np.ndarray:
    """Rank that owns (stores) each part: contiguous blocks, ``owner[p] = p * world // parts``
    (the identity when ``parts == world``)."""
    return (np.arange(parts, dtype=np.int64) * world) // parts


def owner_counts(ptr: np.ndarray, parts: int, world: int, start: int, m: int) -> np.ndarray:
    """Rows of the stored block ``[start, start + m)`` bound for each rank: part ``p`` is stored
    rows ``ptr[p]:ptr[p + 1]`` (``ptr[-1]`` = N) and lives on rank :func:`part_owners` ``[p]``."""
    first = np.searchsorted(part_owners(parts, world), np.arange(world + 1))
    # stored rows owned by each rank: [rank_start[o], rank_start[o + 1])
    rank_start = ptr[np.minimum(first, parts)]
    rank_start[-1] = ptr[-1]
    return np.diff(np.clip(rank_start, start, start + m) - start)


@dataclass(frozen=True, eq=False)
class DistributedPartition:
    """One rank's piece of a partition made by :func:`partition_distributed`.

    Concatenating ``dest`` over ranks (rank order) gives the single-process
    :attr:`Partition.assignment` of the concatenated input, and concatenating ``order`` gives
    :attr:`Partition.order`. No rank holds either whole.

    Attributes
    ----------
    method : str
    rank, world : int
        This rank and the group size.
    counts : ndarray of shape (world,), int64
        Input rows per rank; this rank's rows are global rows ``input_offset + i``.
    sizes : ndarray of shape (P,), int64
        Global rows per part (the sharding shapes).
    dest : ndarray of shape (n_local,), int32 (int64 when N >= 2**31)
        Part of each of this rank's input rows.
    position : ndarray of shape (n_local,), int32 (int64 when N >= 2**31)
        Row of each input row inside its part's stored order.
    order : ndarray, int32 (int64 when N >= 2**31)
        Global input row of each stored row of the parts this rank owns, in stored order
        (parts ``owned_parts`` back to back). The index arrays are int32 whenever every
        global row fits (the same dtype on every rank): half the memory of int64.
    params : dict
        Method parameters (JSON-serialisable), as in :class:`Partition`.
    exchange_bytes : dict
        Bytes this rank sent plus received, per phase (for memory and network budgets).
    peak_buffer : int
        Largest send + receive buffer pair of any one collective on this rank, in bytes.
    exchange_seconds : dict
        Wall seconds this rank spent inside collectives, per phase (waiting included).
    phase_seconds : dict
        Wall seconds this rank spent in each phase, computing and communicating (a profile).
    """

    method: str
    rank: int
    world: int
    counts: np.ndarray
    sizes: np.ndarray
    dest: np.ndarray
    position: np.ndarray
    order: np.ndarray
    params: dict = field(default_factory=dict)
    exchange_bytes: dict = field(default_factory=dict)
    peak_buffer: int = 0
    exchange_seconds: dict = field(default_factory=dict)
    phase_seconds: dict = field(default_factory=dict)

    @property
    def nparts(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def num_points(self) -> int:
        return int(self.counts.sum())

    @property
    def input_offset(self) -> int:
        """Global row of this rank's first input row."""
        return int(self.counts[: self.rank].sum())

    @property
    def offsets(self) -> np.ndarray:
        """``partptr``: stored row where each part starts, length P + 1."""
        return np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)

    @property
    def owners(self) -> np.ndarray:
        """Rank that owns each part."""
        return part_owners(self.nparts, self.world)

    @property
    def owned_parts(self) -> range:
        """Parts stored on this rank (may be empty when parts < world)."""
        mine = np.flatnonzero(self.owners == self.rank)
        return range(int(mine[0]), int(mine[-1]) + 1) if mine.size else range(0)

    @property
    def owned_rows(self) -> tuple[int, int]:
        """Global stored rows ``[start, stop)`` held by this rank after redistribution."""
        off = self.offsets
        parts = self.owned_parts
        if not len(parts):
            start = int(off[int(np.searchsorted(self.owners, self.rank))])
            return start, start
        return int(off[parts.start]), int(off[parts.stop])

    @property
    def stored_index(self) -> np.ndarray:
        """Global stored row of each input row (``offsets[dest] + position``)."""
        return self.offsets[self.dest] + self.position.astype(np.int64)

    def __repr__(self) -> str:
        return (
            f"DistributedPartition(method={self.method!r}, rank={self.rank}/{self.world}, "
            f"N={self.num_points}, parts={self.nparts}, local rows={self.dest.shape[0]}, "
            f"owned rows={self.order.shape[0]})"
        )
