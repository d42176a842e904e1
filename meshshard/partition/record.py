"""The record of a cut: :class:`Partition` (and, re-exported, :class:`HaloPlan`).

A partition is a permutation plus a pointer array of shard boundaries, nothing more:
``order`` lists the original row of every stored row (shard 0's rows first, then shard 1's, ...),
``offsets`` (``partptr``) marks where each shard starts. ``sizes`` are the *sharding shapes*
along the point dimension; they are uneven by design and may contain zeros.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition.haloplan import HaloPlan

__all__ = ["SCHEMA_VERSION", "HaloPlan", "Partition", "shard_labels"]

SCHEMA_VERSION = 1


def _as_int64(a: Any, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1:
        msg = f"{name} must be 1-D, got shape {arr.shape}"
        raise ValueError(msg)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        msg = f"{name} must hold integers, got dtype {arr.dtype}"
        raise TypeError(msg)
    return arr.astype(np.int64, copy=False)


def shard_labels(sizes: Any, dtype: Any = np.int64) -> np.ndarray:
    """``[0]*sizes[0] + [1]*sizes[1] + ...`` as an array: the shard of every stored row.

    One slice fill per shard; ``np.repeat`` with a counts array copies element by element and
    is several times slower on millions of rows."""
    sizes = np.asarray(sizes, dtype=np.int64)
    out = np.empty(int(sizes.sum()), dtype=dtype)
    start = 0
    for p, size in enumerate(sizes.tolist()):
        out[start : start + size] = p
        start += size
    return out


@dataclass(frozen=True, eq=False)
class Partition:
    """How one sample's N rows were cut into ``nparts`` shards.

    Attributes
    ----------
    assignment : ndarray of shape (N,), int64
        Shard of every original row.
    order : ndarray of shape (N,), int64
        Permutation: stored row ``i`` is original row ``order[i]``. Rows of a shard are
        contiguous and keep the method's locality order inside the shard.
    sizes : ndarray of shape (P,), int64
        Rows per shard (the sharding shapes); zeros are legal.
    method : str
        ``"morton"``, ``"hilbert"``, ``"rcb"``, ``"metis"``, ... .
    params : dict
        JSON-serialisable parameters the method was called with.
    """

    assignment: np.ndarray
    order: np.ndarray
    sizes: np.ndarray
    method: str = "unknown"
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        assignment = _as_int64(self.assignment, "assignment")
        order = _as_int64(self.order, "order")
        sizes = _as_int64(self.sizes, "sizes")
        n = assignment.shape[0]
        if order.shape[0] != n:
            msg = f"order has {order.shape[0]} rows but assignment has {n}"
            raise ValueError(msg)
        if sizes.size < 1:
            msg = "a partition needs at least one part (sizes is empty)"
            raise ValueError(msg)
        if (sizes < 0).any() or int(sizes.sum()) != n:
            msg = f"sizes {sizes.tolist()} must be >= 0 and sum to N={n}"
            raise ValueError(msg)
        if n and (assignment.min() < 0 or assignment.max() >= sizes.size):
            lo, hi = assignment.min(), assignment.max()
            msg = f"assignment values must lie in [0, {sizes.size}); found {lo}..{hi}"
            raise ValueError(msg)
        counts = np.bincount(assignment, minlength=sizes.size)
        if not np.array_equal(counts, sizes):
            msg = "sizes do not match the bincount of assignment"
            raise ValueError(msg)
        check = np.zeros(n, dtype=bool)
        check[order] = True
        if not check.all():
            msg = "order is not a permutation of range(N)"
            raise ValueError(msg)
        if n:
            stored = assignment[order]
            start = 0
            for p, size in enumerate(sizes.tolist()):
                if size and not (stored[start : start + size] == p).all():
                    msg = "order does not make every shard contiguous in shard order"
                    raise ValueError(msg)
                start += size
        for name, arr in (("assignment", assignment), ("order", order), ("sizes", sizes)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "params", dict(self.params))

    # ------------------------------------------------------------------ basic views
    @property
    def nparts(self) -> int:
        return int(self.sizes.size)

    @property
    def num_points(self) -> int:
        return int(self.assignment.size)

    @property
    def offsets(self) -> np.ndarray:
        """``partptr``: shard ``p`` holds stored rows ``offsets[p]:offsets[p + 1]`` (length P+1)."""
        return np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)

    @property
    def inverse(self) -> np.ndarray:
        """``inverse[original_row] = stored_row`` (the inverse of :attr:`order`)."""
        inv = np.empty_like(self.order)
        inv[self.order] = np.arange(self.order.size, dtype=np.int64)
        return inv

    def shard_rows(self, part: int) -> np.ndarray:
        """Original row indices of shard ``part``, in stored order."""
        if not 0 <= part < self.nparts:
            msg = f"part={part} out of range for {self.nparts} parts"
            raise IndexError(msg)
        off = self.offsets
        return self.order[off[part] : off[part + 1]]

    @classmethod
    def from_assignment(
        cls,
        assignment: Any,
        nparts: int,
        *,
        key: Any = None,
        method: str = "unknown",
        params: dict | None = None,
    ) -> Partition:
        """Build a partition from a shard label per row.

        Rows inside a shard are ordered by ``key`` (e.g. a space-filling-curve code) when given,
        otherwise by original index. Stable, so the result is deterministic.
        """
        assignment = _as_int64(assignment, "assignment")
        if nparts < 1:
            msg = f"parts={nparts} must be >= 1"
            raise ValueError(msg)
        if key is None:
            order = np.argsort(assignment, kind="stable")
        else:
            key = np.asarray(key)
            order = np.lexsort((np.arange(assignment.size), key, assignment))
        sizes = np.bincount(assignment, minlength=nparts)
        return cls(assignment, order, sizes, method=method, params=params or {})

    def __getattr__(self, name: str) -> Any:
        # the record is data at the bottom of the package: quality numbers are computed above
        # it, by meshshard.partition.metrics(part, ...), which builds on it
        if name == "metrics":
            msg = ("Partition.metrics(...) was removed: call meshshard.partition.metrics(part, "
                   "graph=..., points=...) (the same numbers and keywords)")
            raise AttributeError(msg)
        msg = f"'Partition' object has no attribute {name!r}"
        raise AttributeError(msg)

    # ------------------------------------------------------------------ data movement
    def apply(self, array: Any) -> Any:
        """Reorder rows of ``array`` (numpy or torch, first dim N) into stored order."""
        n = self.num_points
        if getattr(array, "shape", (None,))[0] != n:
            msg = f"array has {getattr(array, 'shape', None)} rows; the partition has N={n}"
            raise ValueError(msg)
        try:
            import torch

            if isinstance(array, torch.Tensor):
                return array[torch.as_tensor(self.order, device=array.device)]
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
        return np.asarray(array)[self.order]

    def restore(self, array: Any) -> Any:
        """Inverse of :meth:`apply`: stored order back to original order."""
        inv = self.inverse
        try:
            import torch

            if isinstance(array, torch.Tensor):
                return array[torch.as_tensor(inv, device=array.device)]
        except ImportError:  # pragma: no cover
            pass
        return np.asarray(array)[inv]

    def split(self, array: Any) -> list[Any]:
        """Stored-order ``array`` (already :meth:`apply`-ed) split into per-shard pieces."""
        off = self.offsets
        return [array[off[p] : off[p + 1]] for p in range(self.nparts)]

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write ``partition.npz`` (arrays) and ``partition.json`` (metadata) into directory
        ``path`` (created). No pickle. Returns the directory.

        Each file is written under a temporary name and renamed, and the JSON records the
        SHA-256 of the arrays file: a save interrupted between the two renames (new arrays,
        old metadata) makes :meth:`load` refuse the pair instead of mixing two saves.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez(buf, assignment=self.assignment, order=self.order, sizes=self.sizes)
        blob = buf.getvalue()
        tmp = path / "partition.npz.tmp"
        tmp.write_bytes(blob)
        tmp.replace(path / "partition.npz")
        meta = {
            "schema_version": SCHEMA_VERSION,
            "method": self.method,
            "params": self.params,
            "nparts": self.nparts,
            "num_points": self.num_points,
            "sizes": self.sizes.tolist(),
            "npz_sha256": hashlib.sha256(blob).hexdigest(),
        }
        tmpj = path / "partition.json.tmp"
        tmpj.write_text(json.dumps(meta, indent=2, sort_keys=True))
        tmpj.replace(path / "partition.json")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Partition:
        """Read a partition written by :meth:`save`; errors name the file at fault."""
        path = Path(path)
        npz, js = path / "partition.npz", path / "partition.json"
        for f in (npz, js):
            if not f.is_file():
                msg = f"{f}: missing; is {path} a directory written by Partition.save?"
                raise FileNotFoundError(msg)
        try:
            meta = json.loads(js.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            msg = f"{js}: corrupt metadata ({exc})"
            raise ValueError(msg) from exc
        version = meta.get("schema_version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            msg = (
                f"{js}: schema_version={version!r} is newer than this meshshard understands "
                f"({SCHEMA_VERSION}); upgrade meshshard"
            )
            raise ValueError(msg)
        blob = npz.read_bytes()
        want = meta.get("npz_sha256")  # absent in saves before it was recorded
        if want is not None and hashlib.sha256(blob).hexdigest() != want:
            msg = (
                f"{path}: partition.npz does not match partition.json (checksum differs): "
                "the files come from different saves (an interrupted save?) or one was "
                "changed; save the partition again"
            )
            raise ValueError(msg)
        try:
            with np.load(io.BytesIO(blob), allow_pickle=False) as data:
                arrays = {k: data[k] for k in ("assignment", "order", "sizes")}
        except Exception as exc:  # zipfile/ValueError/KeyError/EOFError on truncation
            msg = f"{npz}: unreadable or truncated ({exc})"
            raise ValueError(msg) from exc
        part = cls(**arrays, method=meta.get("method", "unknown"), params=meta.get("params", {}))
        if part.sizes.tolist() != meta.get("sizes"):
            msg = f"{path}: sizes in partition.json disagree with partition.npz"
            raise ValueError(msg)
        return part

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partition):
            return NotImplemented
        return (
            np.array_equal(self.assignment, other.assignment)
            and np.array_equal(self.order, other.order)
            and np.array_equal(self.sizes, other.sizes)
            and self.method == other.method
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        s = self.sizes
        return (
            f"Partition(method={self.method!r}, N={self.num_points}, parts={self.nparts}, "
            f"sizes min/max={int(s.min())}/{int(s.max())})"
        )
