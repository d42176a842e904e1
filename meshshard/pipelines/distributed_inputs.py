"""Sources that ``preprocess --distributed`` reads by row range: no rank reads the whole input.

A source is a pair ``(arrays, attrs)``: ``arrays[key]`` has ``shape``, ``dtype`` and row
slicing ``[a:b]`` that reads only those rows (a zarr array, a memory-mapped ``.npy``, or the
source row numbers), and ``attrs`` are the store attributes the new store inherits (with
``attrs["arrays"]`` naming the arrays present).

- a finished run store (``run_<i>.zarr``): its arrays, read chunk by chunk;
- a point set (``<name>.npy`` of shape (N, 3) or (N, 2)): memory-mapped (``np.load(...,
  mmap_mode="r")``), so a rank touches only the pages of its rows. It becomes the
  ``volume`` part (``--surface``: the ``surface`` part) with ``<part>_mesh_centers`` and
  ``<part>_perm`` (the row in the file); a sibling ``<name>.fields.npy`` with N rows becomes
  ``<part>_fields``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["is_source", "open_source", "source_name"]

FIELDS_SUFFIX = ".fields.npy"


class RowNumbers:
    """The source row of every row, sliced lazily (``perm`` of a file that has none)."""

    dtype = np.dtype(np.int64)

    def __init__(self, n: int) -> None:
        self.shape = (int(n),)

    def __getitem__(self, sel: slice) -> np.ndarray:
        a, b, _ = sel.indices(self.shape[0])
        return np.arange(a, b, dtype=np.int64)


def is_source(path: Path) -> bool:
    """A run store or a point-set ``.npy`` (not a ``.fields.npy``)."""
    if path.name.endswith(".npy"):
        return path.is_file() and not path.name.endswith(FIELDS_SUFFIX)
    return (path / "zarr.json").is_file()


def source_name(path: Path) -> str:
    """The run name of a source: ``run_1`` for ``run_1.zarr`` and ``cloud`` for ``cloud.npy``."""
    for suffix in (".zarr", ".npy"):
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    return path.name


def open_source(path: str | Path, part: str = "volume") -> tuple[Any, dict]:
    """``(arrays, attrs)`` of a run store or a point-set ``.npy`` (see the module notes).

    Raises
    ------
    ValueError
        A ``.npy`` that is not (N, 2) or (N, 3) real numbers, or fields with another N.
    StoreError, FileNotFoundError
        A store that is not finished (see :func:`~meshshard.pipelines.store.open_store`).
    """
    path = Path(path)
    if not path.name.endswith(".npy"):
        from meshshard.pipelines.store import open_store

        return open_store(path)
    from meshshard.pipelines.drivaerml import file_fingerprint
    from meshshard.pipelines.store import STORE_SCHEMA_VERSION

    pts = np.load(path, mmap_mode="r", allow_pickle=False)
    if pts.ndim != 2 or pts.shape[1] not in (2, 3) or pts.dtype.kind not in "fiu":
        msg = (
            f"{path}: a point set must be an (N, 3) or (N, 2) array of numbers, got "
            f"shape {pts.shape} dtype {pts.dtype}"
        )
        raise ValueError(msg)
    n = int(pts.shape[0])
    arrays: dict[str, Any] = {f"{part}_mesh_centers": pts, f"{part}_perm": RowNumbers(n)}
    sources = {"points": file_fingerprint(path)}
    fpath = path.with_name(source_name(path) + FIELDS_SUFFIX)
    columns: list[str] = []
    if fpath.is_file():
        f = np.load(fpath, mmap_mode="r", allow_pickle=False)
        if f.ndim == 0 or f.shape[0] != n:
            msg = f"{fpath}: fields must have the {n} rows of {path.name}, got shape {f.shape}"
            raise ValueError(msg)
        arrays[f"{part}_fields"] = f
        sources["fields"] = file_fingerprint(fpath)
        columns = [f"field_{i}" for i in range(int(np.prod(f.shape[1:], dtype=np.int64)))]
    attrs = {
        "schema_version": STORE_SCHEMA_VERSION,
        "run": source_name(path),
        "index": None,
        "sources": sources,
        "dataset": "npy",
        "request": None,
        "length": None,
        part: {"columns": columns, "scales": None, "n_source_cells": n, "dropped_nan": 0},
        "arrays": {k: [n, *a.shape[1:]] for k, a in arrays.items()},
    }
    return arrays, attrs
