"""The record of a halo: :class:`HaloPlan`, which rows every shard sends to and receives from
every other shard.

Its own module (not :mod:`~meshshard.partition.record`, which re-exports it) so that
:mod:`~meshshard.partition.halo`, which builds plans, sits below the :class:`Partition` record,
whose ``metrics()`` calls :mod:`~meshshard.partition.quality`, which uses the halo plans: one
way down, no import cycle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["HaloPlan"]


@dataclass(frozen=True, eq=False)
class HaloPlan:
    """Which rows each shard sends to and receives from every other shard.

    Indices live in *stored* (partition) order. For shard ``p``:

    - ``send_ptr[p]`` (length P+1) and ``send_idx[p]``: rows to send to shard ``q`` are
      ``send_idx[p][send_ptr[p][q]:send_ptr[p][q+1]]``, as *local* row indices of shard ``p``.
    - ``recv_ptr[p]`` (length P+1) and ``recv_idx[p]``: ghost rows received from shard ``q`` are
      ``recv_idx[p][recv_ptr[p][q]:recv_ptr[p][q+1]]``, as *global* stored row indices.

    The rows shard ``p`` sends to ``q`` are exactly (same order) the rows ``q`` receives from
    ``p``. A halo exchange appends the ghosts after the local rows, grouped by source shard in
    increasing shard order, so shard ``p``'s extended array has ``sizes[p] + len(recv_idx[p])``
    rows.
    """

    offsets: np.ndarray
    send_ptr: tuple[np.ndarray, ...]
    send_idx: tuple[np.ndarray, ...]
    recv_ptr: tuple[np.ndarray, ...]
    recv_idx: tuple[np.ndarray, ...]
    kind: str = "unknown"
    params: dict = field(default_factory=dict)

    @property
    def nparts(self) -> int:
        return len(self.send_idx)

    def send_counts(self, part: int) -> np.ndarray:
        return np.diff(self.send_ptr[part])

    def recv_counts(self, part: int) -> np.ndarray:
        return np.diff(self.recv_ptr[part])

    def halo_sizes(self) -> np.ndarray:
        """Ghost rows per shard."""
        return np.array([len(r) for r in self.recv_idx], dtype=np.int64)

    def validate(self) -> None:
        """Check that every send list matches the corresponding receive list."""
        off = np.asarray(self.offsets)
        P = self.nparts
        for p in range(P):
            for q in range(P):
                s = self.send_idx[p][self.send_ptr[p][q] : self.send_ptr[p][q + 1]] + off[p]
                r = self.recv_idx[q][self.recv_ptr[q][p] : self.recv_ptr[q][p + 1]]
                if not np.array_equal(s, r):
                    msg = (
                        f"halo plan inconsistent: shard {p} -> {q} sends {s.size} rows, "
                        f"{q} expects {r.size}"
                    )
                    raise ValueError(msg)

    def save(self, path: str | Path) -> Path:
        """Write ``halo.npz`` (flat arrays, no pickle) into directory ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {"offsets": np.asarray(self.offsets)}
        for p in range(self.nparts):
            arrays[f"send_ptr_{p}"] = self.send_ptr[p]
            arrays[f"send_idx_{p}"] = self.send_idx[p]
            arrays[f"recv_ptr_{p}"] = self.recv_ptr[p]
            arrays[f"recv_idx_{p}"] = self.recv_idx[p]
        arrays["meta"] = np.frombuffer(
            json.dumps({"kind": self.kind, "params": self.params, "nparts": self.nparts}).encode(),
            dtype=np.uint8,
        )
        tmp = path / "halo.npz.tmp"
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        tmp.replace(path / "halo.npz")
        return path

    @classmethod
    def load(cls, path: str | Path) -> HaloPlan:
        f = Path(path) / "halo.npz"
        try:
            with np.load(f, allow_pickle=False) as d:
                meta = json.loads(bytes(d["meta"]).decode())
                P = int(meta["nparts"])
                return cls(
                    offsets=d["offsets"],
                    send_ptr=tuple(d[f"send_ptr_{p}"] for p in range(P)),
                    send_idx=tuple(d[f"send_idx_{p}"] for p in range(P)),
                    recv_ptr=tuple(d[f"recv_ptr_{p}"] for p in range(P)),
                    recv_idx=tuple(d[f"recv_idx_{p}"] for p in range(P)),
                    kind=meta.get("kind", "unknown"),
                    params=meta.get("params", {}),
                )
        except FileNotFoundError:
            raise
        except Exception as exc:
            msg = f"{f}: unreadable or corrupt halo plan ({exc})"
            raise ValueError(msg) from exc
