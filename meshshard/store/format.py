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
``rho``, length, the file conventions and field map), ``request`` (the options that produced
the store), ``arrays`` (expected shapes), ``reference`` (the run's ``aRef``, ``lRef`` and where
they came from, when known), and per part (``surface``, ``volume``): ``partition_ptr``,
``sharding_shapes``, ``method``, ``params``, ``columns``, ``scales``, ``chunk``,
``chunk_aligned``, ``halo``; the surface's ``conventions``
(:func:`meshshard.datasets.conventions.record`).

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

Sealing, the checks of every open and full verification are in
:mod:`meshshard.store.integrity`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.errors import StoreError
from meshshard.partition.record import Partition, shard_labels
from meshshard.store.integrity import (
    STORE_SCHEMA_VERSION,
    array_record,
    check_store,
    damaged_store,
    seal_store,
    verify_store,
)

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

#: test hook: os._exit(86) after writing this many arrays (simulates a crash mid-write)
CRASH_ENV = "MESHSHARD_TEST_CRASH_AFTER_ARRAYS"

#: the one table of a store's row arrays (physicsnemo-curator's names): every reader and writer
#: (sharded stores, curator stores, the inference inputs, distributed preprocessing) takes its
#: keys from here
SURFACE_KEYS = ("surface_mesh_centers", "surface_normals", "surface_areas", "surface_fields")
VOLUME_KEYS = ("volume_mesh_centers", "volume_fields")
STL_KEYS = ("stl_coordinates", "stl_faces", "stl_centers", "stl_areas")
#: each part's row arrays, as curator writes them (no permutation)
PART_KEYS = {"surface": SURFACE_KEYS, "volume": VOLUME_KEYS}


def perm_key(part: str) -> str:
    """The array of a part's stored row -> original row permutation (sharded stores)."""
    return f"{part}_perm"


#: each part's row arrays with the permutation, as meshshard's sharded stores hold them
SHARDED_PART_KEYS = {part: (*keys, perm_key(part)) for part, keys in PART_KEYS.items()}


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
        self.integrity[name] = array_record(self.path / name, checksums=True)
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
    stl_keys: tuple[str, ...] = STL_KEYS,
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
    stl_keys : tuple of str
        The STL arrays to keep (a subset of :data:`STL_KEYS`; none: the store holds no STL).

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
        return _write_all(group, w, run, partitions, halos, request, dataset, target_chunk,
                          stl_keys)  # fmt: skip
    finally:
        w.close()


def _write_all(group, w: _Writer, run, partitions, halos, request, dataset, target_chunk,
               stl_keys=STL_KEYS) -> dict:  # fmt: skip
    attrs: dict[str, Any] = {
        "schema_version": STORE_SCHEMA_VERSION,
        "run": run.name,
        "index": run.index,
        "sources": run.sources,
        "dataset": dataset,
        "request": request,
        "length": run.length,
    }
    if getattr(run, "reference", None):
        attrs["reference"] = run.reference
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
        w.put(perm_key(part), data.source_index[order], chunk)
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
        if getattr(data, "conventions", None):
            attrs[part]["conventions"] = data.conventions
    if run.stl is not None:
        s = run.stl
        arrays = {"stl_coordinates": s.coordinates, "stl_faces": s.faces,
                  "stl_centers": s.centers, "stl_areas": s.areas}  # fmt: skip
        for key in STL_KEYS:
            if key in stl_keys:
                w.put(key, arrays[key], target_chunk)
    w.wait()
    attrs["nparts"] = nparts
    attrs["arrays"] = w.shapes
    return seal_store(group, w.path, attrs, w.integrity)


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
        raise damaged_store(
            Path(path), f"array {key!r} cannot be read ({type(exc).__name__}: {exc})"
        ) from exc


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
    attrs = check_store(path)
    return zarr.open_group(str(path), mode="r"), attrs


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
        attrs = check_store(path)
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
    group, attrs = open_store(path)
    a = attrs.get(part)
    if a is None:
        msg = f"{path}: has no {part} part"
        raise StoreError(msg)
    perm = read_array(group, path, perm_key(part)).astype(np.int64, copy=False)
    sizes = np.diff(np.asarray(a["partition_ptr"], dtype=np.int64))
    order = np.empty_like(perm)
    order[np.argsort(perm, kind="stable")] = np.arange(perm.size)  # compressed source index
    assignment = np.empty_like(perm)
    assignment[order] = shard_labels(sizes)
    centres = read_array(group, path, f"{part}_mesh_centers")
    points = np.empty_like(centres)
    points[order] = centres
    return Partition(assignment, order, sizes, method=a["method"], params=dict(a["params"])), points
