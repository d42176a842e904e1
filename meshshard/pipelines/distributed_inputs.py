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
  ``<part>_fields``;
- a VTK XML mesh with several ``<Piece>`` elements (``.vtp``: the surface part, ``.vtu``: the
  volume part): rank ``r`` reads only whole pieces (its ranges start and end at piece
  boundaries, balanced by cells), each with meshshard's reader
  (:mod:`~meshshard.io.vtkxml`), and computes their centres, normals, areas and fields
  as the single-process reader does; ``<part>_perm`` is the cell's number in the file.
  Every rank first decodes the first non-empty piece to learn the arrays' dtypes and columns.
  A sibling ``<name>.stl`` gives the length scale (its extent along x) that ``nut`` needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from meshshard.datasets.drivaerml import file_fingerprint, read_surface, read_volume
from meshshard.io.stl import read_stl
from meshshard.io.vtkxml import VtkXmlFile
from meshshard.store.format import STORE_SCHEMA_VERSION, open_store

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


MESH_PARTS = {".vtp": "surface", ".vtu": "volume"}


def is_source(path: Path) -> bool:
    """A run store, a point-set ``.npy`` (not a ``.fields.npy``) or a ``.vtp``/``.vtu``."""
    if path.name.endswith(".npy"):
        return path.is_file() and not path.name.endswith(FIELDS_SUFFIX)
    if path.suffix in MESH_PARTS:
        return path.is_file()
    return (path / "zarr.json").is_file()


def source_name(path: Path) -> str:
    """The run name of a source: ``run_1`` for ``run_1.zarr`` and ``cloud`` for ``cloud.npy``."""
    for suffix in (".zarr", ".npy", ".vtp", ".vtu"):
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
        A store that is not finished (see :func:`~meshshard.store.format.open_store`).
    """
    path = Path(path)
    if path.suffix in MESH_PARTS:
        return _mesh_source(path)
    if not path.name.endswith(".npy"):
        return open_store(path)
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


class _PieceArray:
    """One array of a :class:`PieceArrays`: ``shape``, ``dtype`` and piece-aligned slicing."""

    def __init__(self, owner: PieceArrays, key: str, shape: tuple, dtype: np.dtype) -> None:
        self.owner, self.key, self.shape, self.dtype = owner, key, shape, dtype

    def __getitem__(self, sel: slice) -> np.ndarray:
        a, b, _ = sel.indices(self.shape[0])
        return self.owner.rows(a, b)[self.key]


class PieceArrays(dict):
    """The arrays of a multi-piece VTK XML mesh, read whole pieces at a time: rows ``[a, b)``
    must start and end at piece boundaries (:meth:`rank_splits` gives such ranges)."""

    def __init__(
        self, path: Path, part: str, cells: list[int], sample: Any, length: float | None
    ) -> None:
        super().__init__()
        self.path, self.part, self.length = path, part, length
        self.starts = np.concatenate([[0], np.cumsum(cells, dtype=np.int64)])
        n = int(self.starts[-1])
        self._last: tuple[tuple[int, int], dict] | None = None
        for key, v in _rows_of(part, sample, 0).items():
            self[key] = _PieceArray(self, key, (n, *v.shape[1:]), v.dtype)

    def rank_splits(self, world: int) -> list[int]:
        """Piece-aligned row bounds of ``world`` ranks, each near an even share of cells
        (ranks get no rows when there are fewer non-empty pieces than ranks)."""
        n = int(self.starts[-1])
        out = [0]
        for r in range(1, world):
            target = n * r / world
            i = int(np.argmin(np.abs(self.starts - target)))
            out.append(max(out[-1], int(self.starts[i])))
        return [*out, n]

    def rows(self, a: int, b: int) -> dict[str, np.ndarray]:
        """The arrays of rows ``[a, b)``, decoding only the pieces inside (cached for the
        next key)."""
        if self._last is not None and self._last[0] == (a, b):
            return self._last[1]
        i, j = np.searchsorted(self.starts, [a, b])
        if a != b and (i > j or self.starts[i] != a or self.starts[j] != b):
            msg = (
                f"{self.path}: rows [{a}, {b}) do not start and end at piece boundaries "
                f"({self.starts.tolist()[:8]}...); pass piece-aligned splits"
            )
            raise ValueError(msg)
        got = [
            _rows_of(self.part, _read_piece(self.path, self.part, p, self.length),
                     int(self.starts[p]))  # fmt: skip
            for p in range(int(i), int(j))
            if self.starts[p + 1] > self.starts[p]
        ]
        out = {
            k: np.concatenate([g[k] for g in got]) if got else v[0:0]
            for k, v in (self._empty().items())
        }
        self._last = ((a, b), out)
        return out

    def _empty(self) -> dict[str, np.ndarray]:
        return {k: np.zeros((0, *v.shape[1:]), dtype=v.dtype) for k, v in self.items()}


def _read_piece(path: Path, part: str, piece: int, length: float | None) -> Any:
    read = read_surface if part == "surface" else read_volume
    return read(path, piece=piece, length=length)


def _rows_of(part: str, data: Any, first: int) -> dict[str, np.ndarray]:
    """A piece's rows as store arrays; ``perm`` is the cell's number in the whole file."""
    out = {f"{part}_mesh_centers": data.centers}
    if part == "surface":
        out["surface_normals"] = data.normals
        out["surface_areas"] = data.areas
    out[f"{part}_fields"] = data.fields
    out[f"{part}_perm"] = data.source_index + first
    return out


def _mesh_source(path: Path) -> tuple[PieceArrays, dict]:
    part = MESH_PARTS[path.suffix]
    with VtkXmlFile(path, threads=1, piece=0) as f:  # the XML only: piece sizes
        cells = list(f.piece_cells)
    first = next((p for p, c in enumerate(cells) if c), None)
    if first is None:
        msg = f"{path}: every piece has 0 cells"
        raise ValueError(msg)
    sources = {part: file_fingerprint(path)}
    length = None
    stl = path.with_suffix(".stl")
    if stl.is_file():
        length = float(read_stl(stl).length)
        sources["stl"] = file_fingerprint(stl)
    sample = _read_piece(path, part, first, length)
    arrays = PieceArrays(path, part, cells, sample, length)
    n = int(arrays.starts[-1])
    attrs = {
        "schema_version": STORE_SCHEMA_VERSION,
        "run": source_name(path),
        "index": None,
        "sources": sources,
        "dataset": path.suffix[1:],
        "request": None,
        "length": length,
        part: {"columns": sample.columns, "scales": sample.scales, "n_source_cells": n,
               "dropped_nan": 0},  # fmt: skip
        "arrays": {k: list(a.shape) for k, a in arrays.items()},
    }
    return arrays, attrs
