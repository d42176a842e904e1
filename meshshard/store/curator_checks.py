"""Checks of a physicsnemo-curator store before and while it is read (numpy and json only:
the ``inspect`` command uses them without importing torch).

Curator's layout records no checksums (meshshard's own stores record every chunk's size and
crc32), and zarr reads a chunk file that is not there as the array's fill value: a deleted
chunk became rows of zeros (truth 0, centres at the origin) with no error. So, before any
data is read, every array meshshard uses must

- hold the kind of numbers its role needs (geometry and fields: floating point; faces:
  integers) -- :func:`check_array_meta`;
- have a chunk file for every chunk of its declared shape: a declared extent the chunk files
  do not cover is an error naming the array and the first missing chunk, never zeros. The
  count is compared first, so a shape declaring 1e15 rows over 5 chunk files fails at once
  instead of filling zeros until memory runs out.

While reading, a chunk that does not decode (truncated, garbage) is a :class:`StoreError`
naming the store and the array (:func:`read_block`), and values that must be finite (fields,
geometry) are checked (:func:`value_problems`).

What no check can find without a checksum: a value changed to another finite value, in a
chunk that still decodes. Treat a curator store from an untrusted source as untrusted data.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.errors import StoreError

__all__ = ["FLOAT_KEYS", "FLOW_RANGE", "INT_KEYS", "check_array_meta", "check_flow",
           "is_curator_store", "read_block", "value_problems", "verify_curator_store"]

#: flow speed (m/s) and density (kg/m^3) outside this range are refused as absurd: the
#: non-dimensional fields (raw / (rho U^2)) would over- or underflow float32
FLOW_RANGE = (1e-6, 1e6)
#: arrays whose values are real numbers (geometry, fields); faces are integers
FLOAT_KEYS = ("surface_mesh_centers", "surface_normals", "surface_areas", "surface_fields",
               "volume_mesh_centers", "volume_fields", "stl_coordinates", "stl_centers",
               "stl_areas")
INT_KEYS = ("stl_faces",)
_MAX_META_BYTES = 1 << 20
#: above this many chunks, a shortfall is reported by count before looking for names
_MAX_LISTED = 1 << 20
_FIX = "the layout has no checksums; copy or regenerate the store"


def _array_meta(path: Path, key: str) -> dict:
    f = path / key / "zarr.json"
    try:
        if not f.is_file() or f.stat().st_size > _MAX_META_BYTES:
            msg = f"{path}: array {key}: {f.name} missing, not a file, or over 1 MB"
            raise StoreError(msg)
        meta = json.loads(f.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        if isinstance(exc, StoreError):
            raise
        msg = f"{path}: array {key}: unreadable zarr.json ({type(exc).__name__}); {_FIX}"
        raise StoreError(msg) from None
    if not isinstance(meta, dict) or meta.get("node_type") != "array":
        msg = f"{path}: {key} is not a zarr v3 array"
        raise StoreError(msg)
    return meta


def _grid(path: Path, key: str, meta: dict) -> tuple[list[int], list[int]]:
    shape = meta.get("shape")
    chunks = (meta.get("chunk_grid") or {}).get("configuration", {}).get("chunk_shape")
    ok = (isinstance(shape, list) and isinstance(chunks, list) and len(shape) == len(chunks)
          and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)
          and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in chunks))
    if not ok or (meta.get("chunk_grid") or {}).get("name") != "regular":
        msg = (f"{path}: array {key}: shape {shape} and chunk grid "
               f"{meta.get('chunk_grid')} are not a regular grid meshshard can check")
        raise StoreError(msg)
    return shape, chunks


def _key_format(meta: dict) -> tuple[str, str]:
    """(prefix, separator) of the chunk file names."""
    enc = meta.get("chunk_key_encoding") or {}
    sep = (enc.get("configuration") or {}).get("separator", "/" if enc.get("name") ==
                                                           "default" else ".")
    return ("c" + sep, sep) if enc.get("name", "default") == "default" else ("", sep)


def _count_files(root: Path) -> int:
    n = 0
    for _, _, files in os.walk(root):
        n += sum(1 for f in files if f != "zarr.json")
    return n


def _chunk_path(base: Path, prefix: str, sep: str, idx: tuple[int, ...]) -> Path:
    name = prefix + sep.join(str(i) for i in idx) if idx else prefix.rstrip(sep) or "c"
    return base / name


def check_array_meta(path: str | Path, key: str) -> tuple[int, ...]:
    """Dtype and chunk coverage of array ``key`` of the curator store ``path`` (see the module
    notes); returns its declared shape.

    Raises
    ------
    StoreError
        Naming the store, the array and the fix.
    """
    path = Path(path)
    meta = _array_meta(path, key)
    dtype = str(meta.get("data_type"))
    kind = np.dtype(dtype).kind if dtype in np.sctypeDict else "?"
    if key in FLOAT_KEYS and kind != "f":
        msg = (f"{path}: array {key} holds {dtype}; curator writes geometry and fields as "
               "floating point (float32) -- this store was written by something else")
        raise StoreError(msg)
    if key in INT_KEYS and kind not in "iu":
        msg = f"{path}: array {key} holds {dtype}; faces are integer vertex ids"
        raise StoreError(msg)
    shape, chunks = _grid(path, key, meta)
    per_dim = [math.ceil(s / c) for s, c in zip(shape, chunks)]
    need = math.prod(per_dim)
    if need == 0:
        return tuple(shape)
    base = path / key
    # a huge declared grid: the count of files present first (no walk over 1e10 names)
    have = _count_files(base) if need > _MAX_LISTED else need
    if have < need:
        msg = (f"{path}: array {key} declares shape {tuple(shape)} in {need:,} chunk(s), but "
               f"only {have:,} chunk file(s) are present: missing rows would read as zeros; "
               f"{_FIX}")
        raise StoreError(msg)
    prefix, sep = _key_format(meta)
    for flat in range(need):
        idx = tuple(int(i) for i in np.unravel_index(flat, per_dim))
        cp = _chunk_path(base, prefix, sep, idx)
        if not cp.is_file():
            what = "is not a regular file (a FIFO would block, a device never end)" \
                if cp.exists() else "is missing: it would read as zeros"
            msg = (f"{path}: array {key}: chunk {'.'.join(map(str, idx))} (rows from "
                   f"{idx[0] * chunks[0]:,}) {what}; {_FIX}")
            raise StoreError(msg)
    return tuple(shape)


def read_block(arr: Any, path: str | Path, key: str, sel: Any = Ellipsis) -> np.ndarray:
    """``arr[sel]`` as numpy, a chunk that does not decode as a :class:`StoreError` naming the
    store and the array (blosc's own message named neither)."""
    try:
        return np.asarray(arr[sel])
    except MemoryError:
        raise
    except Exception as exc:
        msg = (f"{path}: array {key}: a chunk does not decode ({type(exc).__name__}: "
               f"{str(exc)[:160]}); it is truncated or damaged; {_FIX}")
        raise StoreError(msg) from None


def value_problems(path: str | Path, rows: dict[str, np.ndarray], first_row: int = 0) -> str:
    """The first non-finite value among ``rows`` (fields, geometry; their first row is row
    ``first_row`` of the store), as one line ('' if none)."""
    for k, a in rows.items():
        if a.dtype.kind != "f" or a.size == 0:
            continue
        finite = np.isfinite(a)
        if not finite.all():
            bad = np.flatnonzero(~finite.reshape(a.shape[0], -1).all(axis=1))
            what = "the truth" if k.endswith("_fields") else "the geometry"
            return (f"{path}: array {k} has {bad.size} row(s) with NaN or inf (first at row "
                    f"{first_row + int(bad[0])}); {what} must be finite -- repair or drop "
                    "the run")
    return ""


def check_flow(path: str | Path, u: float, rho: float) -> None:
    """Flow speed ``u`` (m/s) and density ``rho`` (kg/m^3) finite and in :data:`FLOW_RANGE`
    (air density 1e308 gave inf fields)."""
    lo, hi = FLOW_RANGE
    if not (np.isfinite(u) and u > 0 and np.isfinite(rho) and rho > 0):
        msg = f"{path}: stream_velocity={u} and air_density={rho} must be finite and > 0"
        raise StoreError(msg)
    if not (lo <= u <= hi and lo <= rho <= hi):
        msg = (f"{path}: stream_velocity={u:g} m/s and air_density={rho:g} kg/m^3 must lie in "
               f"[{lo:g}, {hi:g}] (the non-dimensional fields would over- or underflow); fix "
               "the store's attributes")
        raise StoreError(msg)


def _is_curator(path: Path) -> bool:
    """A zarr v3 group without meshshard's ``schema_version``, with curator's centres."""
    try:
        meta = json.loads((path / "zarr.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(meta, dict) or meta.get("node_type") != "group" or \
            "schema_version" in (meta.get("attributes") or {}):
        return False
    return any((path / k / "zarr.json").is_file() for k in ("surface_mesh_centers",
                                                            "volume_mesh_centers"))


def is_curator_store(path: str | Path) -> bool:
    """Whether ``path`` is a physicsnemo-curator store (see :func:`_is_curator`)."""
    return _is_curator(Path(path))


def verify_curator_store(path: str | Path) -> dict[str, Any]:
    """Everything that can be checked in a curator store without checksums: dtypes and chunk
    coverage of every array, the flow conditions in its attributes, then every chunk of every
    array read (it decodes) and every real value finite. Returns ``{"checksums": ...,
    "arrays": {name: {"shape", "dtype", "chunks"}}}``.

    Raises
    ------
    StoreError
        The first problem, naming the store and the array.
    """
    import zarr

    path = Path(path)
    if not _is_curator(path):
        msg = f"{path}: not a physicsnemo-curator store (a zarr v3 group with surface_mesh_centers)"
        raise StoreError(msg)
    g = zarr.open_group(str(path), mode="r")
    for key in (*FLOAT_KEYS, *INT_KEYS):
        if key in g:
            check_array_meta(path, key)
    attrs = dict(g.attrs)
    u, rho = attrs.get("stream_velocity"), attrs.get("air_density")
    if isinstance(u, (int, float)) and isinstance(rho, (int, float)):
        check_flow(path, float(u), float(rho))
    arrays: dict[str, Any] = {}
    for key in (*FLOAT_KEYS, *INT_KEYS):
        if key not in g:
            continue
        arr = g[key]
        if not isinstance(arr, zarr.Array):
            msg = f"{path}: {key} is not an array"
            raise StoreError(msg)
        shape = check_array_meta(path, key)
        if not shape:
            read_block(arr, path, key)
            continue
        row_bytes = arr.dtype.itemsize * math.prod(shape[1:])
        per_chunk = int(arr.chunks[0])
        step = per_chunk * max(1, (16 << 20) // max(1, per_chunk * row_bytes))  # ~16 MB reads
        for lo in range(0, shape[0], step):
            block = read_block(arr, path, key, slice(lo, lo + step))
            if block.dtype.kind == "f":
                problem = value_problems(path, {key: block}, lo)
                if problem:
                    raise StoreError(problem)
        grid = [math.ceil(s / c) for s, c in zip(shape, arr.chunks)]
        arrays[key] = {"shape": list(shape), "dtype": str(arr.dtype),
                       "chunks": math.prod(grid)}
    return {"checksums": "none in this layout: chunks present, decoding and finite only",
            "arrays": arrays}
