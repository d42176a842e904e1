"""The sharded run store: one zarr v3 group ``run_<i>.zarr`` per run.

Layout (PhysicsNeMo's DrivaerML keys, rows in partition order)::

    surface_mesh_centers (N, 3) f4   surface_normals (N, 3) f4   surface_areas (N,) f4
    surface_fields (N, F) f4         surface_perm (N,) i8     stored row -> source cell id
    volume_mesh_centers (M, 3) f4    volume_fields (M, G) f4    volume_perm (M,) i8
    stl_coordinates (V, 3) f4        stl_faces (T, 3) i8        stl_centers (T, 3) f4
    stl_areas (T,) f4
    <part>_halo_{send,recv}_{ptr,idx,split}   (only with a halo radius)

Attributes (``group.attrs``): ``schema_version``, ``complete`` (written last), ``run``,
``nparts``, ``sources`` (fingerprints of the source files, see
:func:`meshshard.datasets.drivaerml.file_fingerprint`), ``dataset`` (field names, ``u_inf``,
``rho``, length), ``request`` (the options that produced the store), ``arrays`` (expected
shapes), and per part (``surface``, ``volume``): ``partition_ptr``, ``sharding_shapes``,
``method``, ``params``, ``columns``, ``scales``, ``chunk``, ``chunk_aligned``, ``halo``.

Integrity: ``integrity`` records, per array, its metadata file and every chunk file written
(relative path -> ``[size, crc32]``; chunks that hold only the fill value are not written by
zarr, so they are not listed). :func:`open_store` (and so every loader and the preprocessing
rerun check) checks it cheaply: every chunk file present, with its size, and no other chunk
file. :func:`verify_store` (``meshshard inspect STORE --verify``) recomputes every checksum. The
attributes are validated on every open: ``schema_version`` an int, ``partition_ptr`` starting
at 0, non-decreasing, ending at the part's row count, ``nparts + 1`` long, and each array's
rows equal to its part's rows.

Chunks: zarr 3.1 has only regular chunk grids, so the chunk length along rows is the largest
divisor of every shard offset that is <= ``target_chunk`` rows (each rank then reads whole
chunks only); when the offsets share no divisor >= 1024 rows (or half an average shard, for
small samples) it is ``target_chunk`` (128Ki rows) and ``chunk_aligned`` is false.

Length (~680 lines): the store format in one place: writer, seal, integrity checks and readers
must agree on every key and attribute, and are changed together when the format changes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.errors import StoreError

__all__ = [
    "STORE_SCHEMA_VERSION",
    "StoreError",
    "choose_chunk",
    "inspect_store",
    "open_store",
    "seal_store",
    "store_status",
    "verify_store",
    "write_store",
]

log = logging.getLogger(__name__)

STORE_SCHEMA_VERSION = 1
#: test hook: os._exit(86) after writing this many arrays (simulates a crash mid-write)
CRASH_ENV = "MESHSHARD_TEST_CRASH_AFTER_ARRAYS"

SURFACE_KEYS = ("surface_mesh_centers", "surface_normals", "surface_areas", "surface_fields")
VOLUME_KEYS = ("volume_mesh_centers", "volume_fields")
STL_KEYS = ("stl_coordinates", "stl_faces", "stl_centers", "stl_areas")


def choose_chunk(
    offsets: np.ndarray, n: int, *, target: int = 1 << 17, min_chunk: int = 1024
) -> tuple[int, bool]:
    """Chunk length along rows and whether every shard boundary falls on a chunk boundary."""
    inner = [int(o) for o in offsets[1:-1] if 0 < o < n]
    if n == 0:
        return 1, True
    if not inner:
        return max(1, min(n, target)), True
    g = 0
    for o in inner:
        g = math.gcd(g, o)
    best = 0
    for d in range(1, math.isqrt(g) + 1):
        if g % d == 0:
            for c in (d, g // d):
                if c <= target and c > best:
                    best = c
    # a divisor is only worth it when chunks stay large: >= min_chunk rows, or (small samples)
    # at least half an average shard
    if best >= min(min_chunk, -(-n // (2 * (len(offsets) - 1)))):
        return best, True
    return max(1, min(n, target)), False


def _compressors(name: str | None):
    if name is None or name == "none":
        return None
    from zarr.codecs import BloscCodec, ZstdCodec

    if name == "zstd":
        return ZstdCodec(level=1)
    if name == "lz4":
        return BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")
    msg = f"compressor={name!r} is not one of 'lz4', 'zstd', None"
    raise ValueError(msg)


class _Writer:
    """Writes arrays one after another in a background thread, so that the next array's
    partition-order gather overlaps the previous array's compression and I/O (at most one
    array in flight)."""

    def __init__(self, group, path: Path, compressor: str | None):
        from concurrent.futures import ThreadPoolExecutor

        self.group = group
        self.path = path
        self.compressors = _compressors(compressor)
        self.shapes: dict[str, list[int]] = {}
        self.integrity: dict[str, dict] = {}
        crash = os.environ.get(CRASH_ENV)
        self.crash_after = int(crash) if crash else None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zarr-writer")
        self._pending = None

    def put(self, name: str, data: np.ndarray, chunk_rows: int) -> None:
        self.wait()
        self._pending = self._pool.submit(self._put, name, data, chunk_rows)

    def wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

    def _put(self, name: str, data: np.ndarray, chunk_rows: int) -> None:
        chunks = (max(1, min(chunk_rows, data.shape[0] or 1)),) + data.shape[1:]
        arr = self.group.create_array(
            name, shape=data.shape, dtype=data.dtype, chunks=chunks, compressors=self.compressors
        )
        if data.size:
            arr[...] = data
        self.shapes[name] = list(data.shape)
        # checksums of the files just written (still in the page cache); this thread overlaps
        # the next array's gather
        self.integrity[name] = _array_files(self.path / name, checksums=True)
        if self.crash_after is not None and len(self.shapes) >= self.crash_after:
            log.error("%s=%d: simulating a crash", CRASH_ENV, self.crash_after)
            os._exit(86)


def write_store(
    path: str | Path,
    run,
    partitions: dict[str, Any],
    halos: dict[str, Any],
    *,
    request: dict,
    dataset: dict,
    compressor: str | None = "lz4",
    target_chunk: int = 1 << 17,
) -> dict:
    """Write ``run`` (a :class:`~meshshard.datasets.drivaerml.RunData`) into a new zarr group
    at ``path`` in partition order; attributes last, ``complete: true`` marking a finished
    store. ``path`` must not exist (the caller writes to a temporary name and renames).

    Parameters
    ----------
    partitions : dict
        ``"surface"``/``"volume"`` -> :class:`~meshshard.partition.Partition` of that part's rows.
    halos : dict
        part -> :class:`~meshshard.partition.HaloPlan` or None.
    request, dataset : dict
        JSON options and dataset description recorded in the attributes.

    Returns
    -------
    dict
        The attributes written.
    """
    import zarr

    path = Path(path)
    group = zarr.open_group(str(path), mode="w-", zarr_format=3)
    w = _Writer(group, path, compressor)
    try:
        return _write_all(group, w, run, partitions, halos, request, dataset, target_chunk)
    finally:
        w.close()


def _write_all(group, w: _Writer, run, partitions, halos, request, dataset, target_chunk) -> dict:
    attrs: dict[str, Any] = {
        "schema_version": STORE_SCHEMA_VERSION,
        "run": run.name,
        "index": run.index,
        "sources": run.sources,
        "dataset": dataset,
        "request": request,
        "length": run.length,
    }
    nparts = None
    for part, data in (("surface", run.surface), ("volume", run.volume)):
        if data is None:
            continue
        part_ = partitions[part]
        nparts = part_.nparts
        off = part_.offsets
        chunk, aligned = choose_chunk(off, part_.num_points, target=target_chunk)
        order = part_.order
        if part == "surface":
            arrays = [
                ("surface_mesh_centers", "centers"),
                ("surface_normals", "normals"),
                ("surface_areas", "areas"),
                ("surface_fields", "fields"),
            ]
        else:
            arrays = [("volume_mesh_centers", "centers"), ("volume_fields", "fields")]
        for key, attr in arrays:
            w.put(key, getattr(data, attr)[order], chunk)
        w.put(f"{part}_perm", data.source_index[order], chunk)
        halo_attrs = None
        plan = halos.get(part)
        if plan is not None:
            P = plan.nparts
            for side in ("send", "recv"):
                idx = getattr(plan, f"{side}_idx")
                ptr = getattr(plan, f"{side}_ptr")
                split = np.concatenate([[0], np.cumsum([len(i) for i in idx])]).astype(np.int64)
                flat = np.concatenate([np.asarray(i, np.int64) for i in idx])
                w.put(f"{part}_halo_{side}_idx", flat, 1 << 20)
                w.put(f"{part}_halo_{side}_split", split, P + 1)
                w.put(f"{part}_halo_{side}_ptr", np.stack([np.asarray(p) for p in ptr]), P)
            halo_attrs = {
                "kind": plan.kind,
                "params": plan.params,
                "halo_sizes": plan.halo_sizes().tolist(),
            }
        attrs[part] = {
            "partition_ptr": off.tolist(),
            "sharding_shapes": part_.sizes.tolist(),
            "method": part_.method,
            "params": part_.params,
            "columns": data.columns,
            "scales": data.scales,
            "n_rows": int(part_.num_points),
            "n_source_cells": int(data.n_source_cells),
            "dropped_nan": int(data.dropped_nan),
            "chunk": chunk,
            "chunk_aligned": aligned,
            "halo": halo_attrs,
        }
    if run.stl is not None:
        s = run.stl
        w.put("stl_coordinates", s.coordinates, target_chunk)
        w.put("stl_faces", s.faces, target_chunk)
        w.put("stl_centers", s.centers, target_chunk)
        w.put("stl_areas", s.areas, target_chunk)
    w.wait()
    attrs["nparts"] = nparts
    attrs["arrays"] = w.shapes
    return seal_store(group, w.path, attrs, w.integrity)


def seal_store(group, path: Path, attrs: dict, records: dict[str, dict] | None = None) -> dict:
    """Finish a store: write ``attrs`` with the integrity record of every array in
    ``attrs["arrays"]`` and ``complete: true``, last. ``records`` holds records already computed
    (by :class:`_Writer` or by the ranks that wrote the chunks); the others are computed here,
    so call this only when every chunk of every array is written. Every writer of a store
    (``write_store``, ``write_graph``, the distributed writer) finishes through here."""
    records = dict(records or {})
    for name in attrs["arrays"]:
        if name not in records:
            records[name] = _array_files(path / name, checksums=True)
    attrs = dict(attrs)
    attrs["integrity"] = {"algorithm": "crc32", "arrays": {k: records[k] for k in attrs["arrays"]}}
    attrs["complete"] = True
    group.attrs.update(json.loads(json.dumps(attrs)))  # plain JSON types only
    return attrs


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return crc


def _chunk_files(array_dir: Path) -> dict[str, int]:
    """Relative path -> size of every chunk file of an array (the files under ``c/``)."""
    out: dict[str, int] = {}
    stack = [array_dir / "c"]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                stack.append(Path(e.path))
            else:
                out[Path(e.path).relative_to(array_dir).as_posix()] = e.stat().st_size
    return out


def _array_files(array_dir: Path, *, checksums: bool) -> dict:
    """The integrity record of one array: ``{"meta": [size, crc32], "chunks": {relative path:
    [size, crc32]}}`` (crc32 None without ``checksums``)."""
    meta = array_dir / "zarr.json"
    files = _chunk_files(array_dir)

    def crc(p: Path) -> int | None:
        return _crc32(p) if checksums else None

    return {
        "meta": [meta.stat().st_size, crc(meta)],
        "chunks": {k: [files[k], crc(array_dir / k)] for k in sorted(files)},
    }


def _damaged(path: Path, what: str) -> StoreError:
    msg = (
        f"{path}: {what}; the store is damaged (check it with `meshshard inspect {path} "
        "--verify`); rerun meshshard preprocess, which rewrites damaged stores"
    )
    return StoreError(msg)


def _check_integrity(path: Path, attrs: dict, *, full: bool) -> dict:
    """Compare the store's files with its integrity record: every chunk file present with its
    recorded size and no other (``full``: and every crc32 equal). Returns counts."""
    rec = attrs.get("integrity")
    if not (
        isinstance(rec, dict)
        and rec.get("algorithm") == "crc32"
        and isinstance(rec.get("arrays"), dict)
    ):
        msg = (
            f"{path}: no integrity record (written before meshshard recorded checksums, or its "
            "attributes were edited); rerun meshshard preprocess, which rewrites it"
        )
        raise StoreError(msg)
    record, shapes = rec["arrays"], attrs["arrays"]
    if set(record) != set(shapes):
        raise _damaged(path, f"the integrity record lists {sorted(record)}, not {sorted(shapes)}")
    n_files = n_bytes = 0
    for name in sorted(shapes):
        want = record[name]
        try:
            meta_want = [int(v) if v is not None else None for v in want["meta"]]
            chunks = {str(k): [int(v[0]), int(v[1])] for k, v in want["chunks"].items()}
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            raise _damaged(path, f"the integrity record of {name!r} is malformed") from None
        adir = path / name
        found = _chunk_files(adir)
        missing = sorted(set(chunks) - set(found))
        if missing:
            raise _damaged(
                path,
                f"array {name!r}: chunk file {name}/{missing[0]} is missing "
                f"({len(missing)} of {len(chunks)} missing)",
            )
        extra = sorted(set(found) - set(chunks))
        if extra:
            raise _damaged(path, f"array {name!r}: unexpected chunk file {name}/{extra[0]}")
        for key, (size, crc) in chunks.items():
            if found[key] != size:
                raise _damaged(
                    path, f"chunk file {name}/{key} has {found[key]} bytes, recorded {size}"
                )
            if full and _crc32(adir / key) != crc:
                raise _damaged(path, f"chunk file {name}/{key}: crc32 differs from the record")
            n_bytes += size
        meta = adir / "zarr.json"
        size = meta.stat().st_size if meta.is_file() else None
        if size != meta_want[0] or (full and _crc32(meta) != meta_want[1]):
            raise _damaged(path, f"array metadata {name}/zarr.json differs from the record")
        n_files += len(chunks)
    return {"arrays": len(shapes), "chunk_files": n_files, "bytes": n_bytes, "checksums": full}


def _not_rows(part: str) -> tuple[str, ...]:
    """Prefixes of a part's arrays whose rows are not the part's rows (halo plans, graph
    shards: see :mod:`meshshard.datasets.graphstore`)."""
    return (f"{part}_halo_", f"{part}_graph_")


def _is_int(v: Any) -> bool:
    return type(v) is int


def _check_attrs(path: Path, attrs: dict) -> None:
    """The attributes a reader relies on: array shapes, ``nparts``, and per part a
    ``partition_ptr`` that starts at 0, never decreases, ends at the part's rows and has
    ``nparts + 1`` entries, the matching ``sharding_shapes``, and arrays of that many rows."""
    arrays = attrs.get("arrays")
    if not isinstance(arrays, dict) or not all(
        isinstance(v, list) and all(_is_int(x) and x >= 0 for x in v) for v in arrays.values()
    ):
        raise _damaged(path, "attribute 'arrays' is not a map of array shapes")
    parts = [p for p in ("surface", "volume") if attrs.get(p) is not None]
    nparts = attrs.get("nparts")
    if parts and not (_is_int(nparts) and nparts >= 1):
        raise _damaged(path, f"nparts={nparts!r} is not an integer >= 1")
    for part in parts:
        a = attrs[part]
        n = a.get("n_rows") if isinstance(a, dict) else None
        if not (_is_int(n) and n >= 0):
            raise _damaged(path, f"{part}: n_rows={n!r} is not an integer >= 0")
        ptr = a.get("partition_ptr")
        if not (isinstance(ptr, list) and ptr and all(_is_int(v) for v in ptr)):
            raise _damaged(path, f"{part}: partition_ptr is not a list of integers")
        if len(ptr) != nparts + 1:
            raise _damaged(
                path, f"{part}: partition_ptr has {len(ptr)} entries for {nparts} parts"
            )
        steps = np.diff(np.asarray(ptr, dtype=np.int64))
        if ptr[0] != 0 or ptr[-1] != n or (steps < 0).any():
            raise _damaged(
                path,
                f"{part}: partition_ptr {ptr[:4]}...{ptr[-2:]} must start at 0, never decrease "
                f"and end at the {n} rows",
            )
        if a.get("sharding_shapes") != steps.tolist():
            raise _damaged(path, f"{part}: sharding_shapes differ from partition_ptr")
        for key, shape in arrays.items():
            if key.startswith(f"{part}_") and not key.startswith(_not_rows(part)):
                if not shape or shape[0] != n:
                    raise _damaged(path, f"array {key!r} has shape {shape}, {part} has {n} rows")


def read_array(group, path: str | Path, key: str, sel: Any = Ellipsis) -> np.ndarray:
    """``group[key][sel]`` as numpy; a chunk that does not decode raises a StoreError naming
    the store and the array (zarr's own message names neither).

    Raises
    ------
    StoreError
    """
    try:
        return np.asarray(group[key][sel])
    except Exception as exc:
        raise _damaged(
            Path(path), f"array {key!r} cannot be read ({type(exc).__name__}: {exc})"
        ) from exc


def _read_attrs(path: Path) -> dict:
    """Attributes of a store; StoreError naming the path when unreadable or too new."""
    meta = path / "zarr.json"
    if not meta.is_file():
        msg = f"{path}: not a zarr v3 group (no zarr.json); rerun meshshard preprocess"
        raise StoreError(msg)
    try:
        attrs = json.loads(meta.read_text()).get("attributes", {})
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        msg = f"{meta}: corrupt metadata ({exc}); rerun meshshard preprocess --overwrite"
        raise StoreError(msg) from exc
    version = attrs.get("schema_version")
    if version is not None and not _is_int(version):
        msg = (
            f"{path}: schema_version={version!r} ({type(version).__name__}) is not an integer; "
            "the store's attributes are damaged: rerun meshshard preprocess --overwrite"
        )
        raise StoreError(msg)
    if isinstance(version, int) and version > STORE_SCHEMA_VERSION:
        msg = (
            f"{path}: schema_version={version} is newer than this meshshard understands "
            f"({STORE_SCHEMA_VERSION}); upgrade meshshard"
        )
        raise StoreError(msg)
    if isinstance(version, int) and version < STORE_SCHEMA_VERSION:
        msg = (
            f"{path}: schema_version={version} was written by an older meshshard (this one "
            f"reads {STORE_SCHEMA_VERSION}); rerun meshshard preprocess with --overwrite"
        )
        raise StoreError(msg)
    if version is None or not attrs.get("complete"):
        msg = f"{path}: incomplete store (no complete attributes); rerun meshshard preprocess"
        raise StoreError(msg)
    return attrs


def _check_arrays(path: Path, attrs: dict) -> None:
    for name, shape in attrs.get("arrays", {}).items():
        meta = path / name / "zarr.json"
        try:
            found = json.loads(meta.read_text())["shape"]
        except (OSError, KeyError, json.JSONDecodeError) as exc:
            msg = f"{path}: array {name!r} missing or corrupt ({exc}); rerun meshshard preprocess"
            raise StoreError(msg) from exc
        if list(found) != list(shape):
            msg = f"{path}: array {name!r} has shape {found}, expected {shape}"
            raise StoreError(msg)


def open_store(path: str | Path):
    """Open a finished store read-only after checking version, completeness, attributes,
    shapes and (cheaply: presence and sizes of the chunk files) its integrity record.

    Returns
    -------
    (zarr.Group, dict)
        The group and its attributes.

    Raises
    ------
    StoreError
        Naming the store when it is incomplete, corrupt or from a newer meshshard.
    """
    import zarr

    path = Path(path)
    if not path.is_dir():
        msg = f"{path}: no such store"
        raise FileNotFoundError(msg)
    attrs = _read_attrs(path)
    _check_attrs(path, attrs)
    _check_arrays(path, attrs)
    _check_integrity(path, attrs, full=False)
    return zarr.open_group(str(path), mode="r"), attrs


def verify_store(path: str | Path) -> dict:
    """Verify a store fully: everything :func:`open_store` checks, then the crc32 of every
    chunk and metadata file against the record written when the store was finished.

    Returns
    -------
    dict
        ``arrays``, ``chunk_files``, ``bytes`` checked and ``checksums: True``.

    Raises
    ------
    StoreError
        Naming the store and the first thing that differs.
    FileNotFoundError
        No store at ``path``.
    """
    path = Path(path)
    _, attrs = open_store(path)
    return _check_integrity(path, attrs, full=True)


def store_status(path: str | Path, *, sources: dict, request: dict) -> str | None:
    """``None`` when the store at ``path`` is finished and up to date for ``sources`` (file
    fingerprints) and ``request`` (options); otherwise the reason it must be (re)written.

    Raises
    ------
    StoreError
        When the store is from a newer meshshard (never overwritten silently).
    """
    path = Path(path)
    if not path.exists():
        return "missing"
    try:
        attrs = _read_attrs(path)
        _check_attrs(path, attrs)
        _check_arrays(path, attrs)
        _check_integrity(path, attrs, full=False)
    except StoreError as exc:
        if "newer" in str(exc) or "older" in str(exc):
            raise  # never replaced without --overwrite
        return str(exc)
    if attrs.get("sources") != sources:
        return "source files changed (size, mtime or checksum differ)"
    stored, wanted = attrs.get("request") or {}, json.loads(json.dumps(request))
    if stored != wanted:
        diff = [
            f"{k} {stored.get(k)!r} -> {wanted.get(k)!r}"
            for k in sorted(set(stored) | set(wanted))
            if stored.get(k) != wanted.get(k)
        ]
        return "options changed: " + ", ".join(diff)
    return None


def inspect_store(path: str | Path) -> dict:
    """A JSON-ready summary of a store, for ``meshshard inspect run_i.zarr``.

    Returns
    -------
    dict
        ``path``, ``run``, ``schema_version``, ``nparts``, ``sources``, ``arrays``
        (name -> shape), and per part: ``sharding_shapes``, ``partition_ptr``, ``method``,
        ``params``, ``balance`` (max/mean shard size), ``chunk``, ``chunk_aligned``,
        ``columns``, ``halo`` (None or ghost rows per shard).
    """
    path = Path(path)
    _, attrs = open_store(path)
    out: dict[str, Any] = {
        "path": str(path),
        "run": attrs.get("run"),
        "schema_version": attrs["schema_version"],
        "nparts": attrs.get("nparts"),
        "sources": attrs.get("sources"),
        "arrays": attrs.get("arrays"),
        "dataset": attrs.get("dataset"),
        "surface_graph": attrs.get("surface_graph"),  # graph shards (preprocess --graph dual)
    }
    for part in ("surface", "volume"):
        a = attrs.get(part)
        if a is None:
            continue
        sizes = np.asarray(a["sharding_shapes"], dtype=np.float64)
        out[part] = {
            "rows": a["n_rows"],
            "source_cells": a["n_source_cells"],
            "dropped_nan": a["dropped_nan"],
            "sharding_shapes": a["sharding_shapes"],
            "partition_ptr": a["partition_ptr"],
            "method": a["method"],
            "params": a["params"],
            "balance": float(sizes.max() / sizes.mean()) if sizes.sum() else 1.0,
            "chunk": a["chunk"],
            "chunk_aligned": a["chunk_aligned"],
            "columns": a["columns"],
            "halo": a["halo"],
        }
    return out


def store_surfels(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The surface's cell normals (N, 3) and areas (N,), in the order of
    :func:`store_partition`'s centres: with them the inspector draws each cell as a small
    oriented patch (stores keep no connectivity)."""
    group, attrs = open_store(path)
    if attrs.get("surface") is None:
        msg = f"{path}: has no surface part"
        raise StoreError(msg)
    perm = read_array(group, path, "surface_perm").astype(np.int64, copy=False)
    order = np.empty_like(perm)
    order[np.argsort(perm, kind="stable")] = np.arange(perm.size)
    normals = read_array(group, path, "surface_normals")
    areas = read_array(group, path, "surface_areas")
    out_n, out_a = np.empty_like(normals), np.empty_like(areas)
    out_n[order], out_a[order] = normals, areas
    return out_n, out_a


def store_partition(path: str | Path, part: str = "surface"):
    """The :class:`~meshshard.partition.Partition` a store was written with, and the cell
    centres in source order, for the partition inspector.

    Rows dropped at preprocessing (``--drop-nan``) are not part of it: the partition is over
    the stored rows, numbered in increasing source-cell order.

    Returns
    -------
    (Partition, ndarray of shape (N, 3))
    """
    from meshshard.partition.record import Partition, shard_labels

    group, attrs = open_store(path)
    a = attrs.get(part)
    if a is None:
        msg = f"{path}: has no {part} part"
        raise StoreError(msg)
    perm = read_array(group, path, f"{part}_perm").astype(np.int64, copy=False)
    sizes = np.diff(np.asarray(a["partition_ptr"], dtype=np.int64))
    order = np.empty_like(perm)
    order[np.argsort(perm, kind="stable")] = np.arange(perm.size)  # compressed source index
    assignment = np.empty_like(perm)
    assignment[order] = shard_labels(sizes)
    centres = read_array(group, path, f"{part}_mesh_centers")
    points = np.empty_like(centres)
    points[order] = centres
    return Partition(assignment, order, sizes, method=a["method"], params=dict(a["params"])), points
