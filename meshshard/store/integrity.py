"""Integrity of the sharded run store: seal, the checks every open makes, full verification.

A store is finished by :func:`seal_store`: its attributes get the integrity record (per array,
its metadata file and every chunk file with size and crc32) and ``complete: true``, last.
Opening a store (:func:`~meshshard.store.format.open_store`, the preprocessing rerun check)
validates the attributes and checks the record cheaply (every chunk file present with its
size, no other); :func:`verify_store` recomputes every crc32. Every failure is a
:class:`~meshshard.errors.StoreError` that names the store and the first thing that differs.

The layout itself is described in :mod:`meshshard.store.format`.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.errors import StoreError

__all__ = [
    "STORE_SCHEMA_VERSION",
    "array_record",
    "check_store",
    "crc32_file",
    "damaged_store",
    "seal_store",
    "verify_store",
]

STORE_SCHEMA_VERSION = 1


def seal_store(group, path: Path, attrs: dict, records: dict[str, dict] | None = None) -> dict:
    """Finish a store: write ``attrs`` with the integrity record of every array in
    ``attrs["arrays"]`` and ``complete: true``, last. ``records`` holds records already computed
    (by :class:`_Writer` or by the ranks that wrote the chunks); the others are computed here,
    so call this only when every chunk of every array is written. Every writer of a store
    (``write_store``, ``write_graph``, the distributed writer) finishes through here."""
    records = dict(records or {})
    for name in attrs["arrays"]:
        if name not in records:
            records[name] = array_record(path / name, checksums=True)
    attrs = dict(attrs)
    attrs["integrity"] = {"algorithm": "crc32", "arrays": {k: records[k] for k in attrs["arrays"]}}
    attrs["complete"] = True
    group.attrs.update(json.loads(json.dumps(attrs)))  # plain JSON types only
    return attrs


def crc32_file(path: Path) -> int:
    """The crc32 of a file's bytes, read in 4 MiB blocks."""
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


def array_record(array_dir: Path, *, checksums: bool) -> dict:
    """The integrity record of one array: ``{"meta": [size, crc32], "chunks": {relative path:
    [size, crc32]}}`` (crc32 None without ``checksums``)."""
    meta = array_dir / "zarr.json"
    files = _chunk_files(array_dir)

    def crc(p: Path) -> int | None:
        return crc32_file(p) if checksums else None

    return {
        "meta": [meta.stat().st_size, crc(meta)],
        "chunks": {k: [files[k], crc(array_dir / k)] for k in sorted(files)},
    }


def damaged_store(path: Path, what: str) -> StoreError:
    """The error for a store whose files or attributes are not what its record says."""
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
        raise damaged_store(
            path, f"the integrity record lists {sorted(record)}, not {sorted(shapes)}"
        )
    n_files = n_bytes = 0
    for name in sorted(shapes):
        want = record[name]
        try:
            meta_want = [int(v) if v is not None else None for v in want["meta"]]
            chunks = {str(k): [int(v[0]), int(v[1])] for k, v in want["chunks"].items()}
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            raise damaged_store(path, f"the integrity record of {name!r} is malformed") from None
        adir = path / name
        found = _chunk_files(adir)
        missing = sorted(set(chunks) - set(found))
        if missing:
            raise damaged_store(
                path,
                f"array {name!r}: chunk file {name}/{missing[0]} is missing "
                f"({len(missing)} of {len(chunks)} missing)",
            )
        extra = sorted(set(found) - set(chunks))
        if extra:
            raise damaged_store(path, f"array {name!r}: unexpected chunk file {name}/{extra[0]}")
        for key, (size, crc) in chunks.items():
            if found[key] != size:
                raise damaged_store(
                    path, f"chunk file {name}/{key} has {found[key]} bytes, recorded {size}"
                )
            if full and crc32_file(adir / key) != crc:
                raise damaged_store(path, f"chunk file {name}/{key}: crc32 differs from the record")
            n_bytes += size
        meta = adir / "zarr.json"
        size = meta.stat().st_size if meta.is_file() else None
        if size != meta_want[0] or (full and crc32_file(meta) != meta_want[1]):
            raise damaged_store(path, f"array metadata {name}/zarr.json differs from the record")
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
        raise damaged_store(path, "attribute 'arrays' is not a map of array shapes")
    parts = [p for p in ("surface", "volume") if attrs.get(p) is not None]
    nparts = attrs.get("nparts")
    if parts and not (_is_int(nparts) and nparts >= 1):
        raise damaged_store(path, f"nparts={nparts!r} is not an integer >= 1")
    for part in parts:
        a = attrs[part]
        n = a.get("n_rows") if isinstance(a, dict) else None
        if not (_is_int(n) and n >= 0):
            raise damaged_store(path, f"{part}: n_rows={n!r} is not an integer >= 0")
        ptr = a.get("partition_ptr")
        if not (isinstance(ptr, list) and ptr and all(_is_int(v) for v in ptr)):
            raise damaged_store(path, f"{part}: partition_ptr is not a list of integers")
        if len(ptr) != nparts + 1:
            raise damaged_store(
                path, f"{part}: partition_ptr has {len(ptr)} entries for {nparts} parts"
            )
        steps = np.diff(np.asarray(ptr, dtype=np.int64))
        if ptr[0] != 0 or ptr[-1] != n or (steps < 0).any():
            raise damaged_store(
                path,
                f"{part}: partition_ptr {ptr[:4]}...{ptr[-2:]} must start at 0, never decrease "
                f"and end at the {n} rows",
            )
        if a.get("sharding_shapes") != steps.tolist():
            raise damaged_store(path, f"{part}: sharding_shapes differ from partition_ptr")
        for key, shape in arrays.items():
            if key.startswith(f"{part}_") and not key.startswith(_not_rows(part)):
                if not shape or shape[0] != n:
                    raise damaged_store(
                        path, f"array {key!r} has shape {shape}, {part} has {n} rows"
                    )


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
    if not path.is_dir():
        msg = f"{path}: no such store"
        raise FileNotFoundError(msg)
    attrs = check_store(path)
    return _check_integrity(path, attrs, full=True)


def check_store(path: Path) -> dict:
    """The checks of every open: version, completeness, attributes, array shapes, and the
    integrity record's files and sizes. Returns the attributes.

    Raises
    ------
    StoreError
    """
    attrs = _read_attrs(path)
    _check_attrs(path, attrs)
    _check_arrays(path, attrs)
    _check_integrity(path, attrs, full=False)
    return attrs

