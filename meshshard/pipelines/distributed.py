"""Distributed (re)partitioning of one huge run store: no rank reads or holds the whole run.

``meshshard preprocess drivaerml SRC DST --parts P --distributed`` under torchrun: SRC is a
finished run store (``run_<i>.zarr``, today's format), a raw point set (``<name>.npy``,
memory-mapped; see :mod:`~meshshard.pipelines.distributed_inputs`) or a directory of them. For
each source, rank ``r`` of ``W`` reads only rows ``[N r / W, N (r + 1) / W)`` of every part
(surface, volume; ``splits`` sets other ranges),
the ranks partition the centres together (:func:`partition_distributed`), move every row's
fields to the rank owning its part (:func:`redistribute_rows`), hand the rows of chunks that
straddle a rank boundary to the chunk's owner, and each rank writes only its chunks of one new
store in the same format (so loaders need no change).

Atomic and resumable as the single-process pipeline: rank 0 creates the store under a
temporary name (``run_<i>.zarr.tmp-<token>``), every rank writes its chunks, the ranks agree
that all writes succeeded (one all_reduce), each rank checksums the chunk files it wrote (in
parallel; the rows are gathered on rank 0), and only then rank 0 writes the attributes with the
integrity record and ``complete: true`` (:func:`~meshshard.store.format.seal_store`, as every
writer) and renames the store. A crash of any rank leaves only a temporary store
without ``complete``, which the next run removes.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm.host import Comm
from meshshard.comm.process import init
from meshshard.errors import DistributedError
from meshshard.partition.distributed import partition_distributed, redistribute_rows
from meshshard.pipelines.distributed_inputs import is_source, open_source, source_name
from meshshard.pipelines.options import RunOptions
from meshshard.store.atomic import publish
from meshshard.store.format import (
    SHARDED_PART_KEYS,
    STL_KEYS,
    _compressors,
    choose_chunk,
    store_status,
)
from meshshard.store.integrity import crc32_file, seal_store

__all__ = ["preprocess_distributed", "repartition_store"]

log = logging.getLogger(__name__)

PART_KEYS = SHARDED_PART_KEYS

# Test hook: {"phase": name, "rank": r} makes rank r raise at that phase.
_FAULT: dict = {}

#: test hook: ``"<rank>:<phase>"`` makes that rank stall (sleep for an hour) at that phase, as
#: a rank stuck in a slow file system or a dead-locked library would
STALL_ENV = "MESHSHARD_TEST_STALL"


def _fault(rank: int, phase: str) -> None:
    if _FAULT.get("phase") == phase and _FAULT.get("rank") == rank:
        msg = f"injected fault on rank {rank} at phase {phase!r}"
        raise RuntimeError(msg)
    if os.environ.get(STALL_ENV) == f"{rank}:{phase}":
        import time

        log.warning("rank %d stalls at phase %r (%s)", rank, phase, STALL_ENV)
        time.sleep(3600)


def _agree_ok(comm, ok: bool, what: str) -> None:
    """Every rank learns whether every rank succeeded (collective); raises on all if not."""
    bad = comm.allgather(np.array([0 if ok else 1], dtype=np.int64))[:, 0]
    if bad.any():
        msg = f"{what} failed on rank(s) {np.flatnonzero(bad).tolist()}; nothing was published"
        raise DistributedError(msg)  # a RuntimeError: the run failed, not (only) its input


def _chunk_rows(comm, arrays: dict[str, np.ndarray], owned: tuple[int, int], n: int, chunk: int):
    """Move rows so that each rank holds whole chunks: chunk ``c`` goes to the rank owning
    its first row (collective). Returns (rows [A, B), arrays of those rows)."""
    W = comm.world
    ranges = comm.allgather(np.array(owned, dtype=np.int64))  # (W, 2) stored rows per rank
    starts = ranges[:, 0]
    # rank owning each chunk's first row; ranks with no rows own no chunk
    n_chunks = -(-n // chunk) if n else 0
    first_rows = np.arange(n_chunks, dtype=np.int64) * chunk
    holders = np.searchsorted(ranges[:, 1], first_rows, side="right")  # first rank with end > row
    bounds = np.zeros(W + 1, dtype=np.int64)  # rows [bounds[o], bounds[o+1]) written by o
    for o in range(W):
        mine = np.flatnonzero(holders == o)
        bounds[o + 1] = min(n, int((mine[-1] + 1) * chunk)) if mine.size else bounds[o]
    for o in range(W):  # ranks without chunks: empty ranges at the running position
        bounds[o + 1] = max(bounds[o + 1], bounds[o])
    s, e = owned
    cut = np.clip(bounds, s, e) - s
    send = np.diff(cut)
    out = {}
    for k, a in arrays.items():
        out[k], _ = comm.alltoallv(np.ascontiguousarray(a), send)
    del starts
    r = comm.rank
    return (int(bounds[r]), int(bounds[r + 1])), out


def _row_range(part: str, n: int, rank: int, W: int, splits: dict | None) -> tuple[int, int]:
    """Rows of ``part`` this rank reads: ``splits[part]`` or an even split."""
    if not splits or part not in splits:
        return (n * rank) // W, (n * (rank + 1)) // W
    b = [int(x) for x in (splits[part](W) if callable(splits[part]) else splits[part])]
    if len(b) != W + 1 or b[0] != 0 or b[-1] != n or any(x > y for x, y in zip(b, b[1:])):
        msg = f"splits[{part!r}]={b} must be {W + 1} non-decreasing rows from 0 to {n}"
        raise ValueError(msg)
    return b[rank], b[rank + 1]


def _chunk_path(index: int, ndim: int) -> str:
    """A chunk file's path under its array (rows chunked, trailing dims whole)."""
    return "/".join(["c", str(index)] + ["0"] * (ndim - 1))


def _own_chunk_records(tmp: Path, local: dict, chunks: dict, shapes: dict) -> np.ndarray:
    """Rows ``[array number, chunk index, size, crc32]`` of every chunk file in the row range
    this rank wrote (arrays numbered in sorted order; fill-value chunks are not written)."""
    names = sorted(chunks)
    out = []
    for (lo, hi), data in local.values():
        if hi <= lo:
            continue
        for k in data:
            c0, c1 = lo // chunks[k], -(-hi // chunks[k])
            for c in range(c0, c1):
                f = tmp / k / _chunk_path(c, len(shapes[k]))
                if f.is_file():
                    out.append((names.index(k), c, f.stat().st_size, crc32_file(f)))
    return np.array(out, dtype=np.int64).reshape(-1, 4)


def _records(tmp: Path, names: list[str], shapes: dict, rows: np.ndarray) -> dict[str, dict]:
    """Integrity records of the row-chunked arrays from every rank's chunk rows; the metadata
    files are checksummed here."""
    out = {}
    for i, k in enumerate(names):
        meta = tmp / k / "zarr.json"
        mine = rows[rows[:, 0] == i]
        chunks = {
            _chunk_path(int(c), len(shapes[k])): [int(size), int(crc)]
            for _, c, size, crc in mine[np.argsort(mine[:, 1])]
        }
        out[k] = {"meta": [meta.stat().st_size, crc32_file(meta)], "chunks": chunks}
    return out


def repartition_store(
    src: str | Path,
    dst_dir: str | Path,
    *,
    parts: int,
    method: str = "hilbert",
    group: Any = None,
    overwrite: bool = False,
    compressor: str | None = "lz4",
    target_chunk: int = 1 << 17,
    which: tuple[str, ...] | None = None,
    splits: dict[str, Any] | None = None,
) -> str:
    """Repartition one finished run store into ``dst_dir/<same name>`` across ranks.

    Collective: every rank of ``group`` must call this with the same arguments; ``src`` and
    ``dst_dir`` must be on a file system every rank sees.

    which : tuple of {"surface", "volume"}, optional
        Parts to keep (default: every part the source has).
    splits : dict of part -> sequence of world + 1 ints, optional
        Rows ``[splits[part][r], splits[part][r + 1])`` of the part are read by rank ``r``
        (uneven and empty ranges allowed; default: even ranges). Must be the same on every
        rank; it does not change the result, only who reads what.

    Returns
    -------
    str
        ``"written"`` or ``"skipped"`` (up to date).

    Raises
    ------
    RuntimeError
        On every rank, when any rank failed (nothing is published).
    """
    comm = Comm(group, what="repartition_store")
    rank = comm.rank
    src = Path(src)
    dst_dir = Path(dst_dir)
    name = source_name(src)
    out = dst_dir / f"{name}.zarr"
    ok, err = True, None
    try:
        sgroup, sattrs = open_source(src, "surface" if which == ("surface",) else "volume")
        request = {"distributed": True, "parts": int(parts), "method": method,
                   "which": list(which) if which else None,
                   "from": str(src.resolve()), "source_request": sattrs.get("request")}  # fmt: skip
        sources = sattrs.get("sources")
        status = "overwrite" if overwrite else store_status(out, sources=sources, request=request)
    except Exception as exc:
        ok, err = False, exc
    comm.phase = "open source"
    _agree_ok(comm, ok, f"opening {src}: {err}" if err else f"opening {src}")
    # skip only when every rank sees an up-to-date store; rank 0's pid names the temporary
    flags = comm.allreduce(np.array([status is not None, os.getpid() if rank == 0 else 0]))
    if not flags[0]:
        return "skipped"
    tmp = dst_dir / f"{name}.zarr.tmp-{int(flags[1])}"
    if rank == 0:
        for p in sorted(dst_dir.glob(f"{name}.zarr.tmp-*")):
            log.warning("%s: removing a stale temporary store left by a crash", p)
            shutil.rmtree(p, ignore_errors=True)
    try:
        return _write(comm, sgroup, sattrs, tmp, out, name, request, parts, method, group,
                      compressor, target_chunk, which, splits)  # fmt: skip
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write(comm, sgroup, sattrs, tmp, out, name, request, parts, method, group, compressor,
           target_chunk, which, splits=None) -> str:  # fmt: skip
    """Partition, move and write; publish on rank 0 once every rank succeeded."""
    import zarr

    rank, W = comm.rank, comm.world
    dst_dir = out.parent
    token = tmp.name.rsplit("-", 1)[-1]
    # the source's own record, arrays and graph shards do not describe the new store
    drop = ("complete", "arrays", "integrity", "surface_graph")
    attrs = {k: v for k, v in sattrs.items() if k not in drop}
    attrs["request"] = request
    attrs["nparts"] = int(parts)
    local: dict[str, tuple[tuple[int, int], dict[str, np.ndarray]]] = {}
    shapes: dict[str, list[int]] = {}
    chunks: dict[str, int] = {}
    for part, keys in PART_KEYS.items():
        if sattrs.get(part) is None or (which and part not in which):
            attrs.pop(part, None)
            continue
        keys = [k for k in keys if k in sattrs.get("arrays", {})]
        if splits is None and hasattr(sgroup, "rank_splits"):  # whole pieces per rank
            splits = {part: sgroup.rank_splits}
        n = int(sgroup[keys[0]].shape[0])
        a, b = _row_range(part, n, rank, W, splits)
        rows = {k: np.asarray(sgroup[k][a:b]) for k in keys}
        dp = partition_distributed(rows[keys[0]], parts, group, method)
        moved = redistribute_rows(rows, dp, group)
        del rows
        chunk, aligned = choose_chunk(dp.offsets, n, target=target_chunk)
        rng, data = _chunk_rows(comm, moved, dp.owned_rows, n, chunk)
        local[part] = (rng, data)
        for k in keys:
            shapes[k] = [n, *sgroup[k].shape[1:]]
            chunks[k] = chunk
        pa = dict(sattrs[part])
        pa.update(partition_ptr=dp.offsets.tolist(), sharding_shapes=dp.sizes.tolist(),
                  method=method, params=dp.params, n_rows=n, chunk=chunk,
                  chunk_aligned=aligned, halo=None)  # fmt: skip
        attrs[part] = pa
    ok, err = True, None
    if rank == 0:  # the empty arrays (metadata only), under the temporary name
        try:
            dst_dir.mkdir(parents=True, exist_ok=True)
            g = zarr.open_group(str(tmp), mode="w-", zarr_format=3)
            comp = _compressors(compressor)
            for k, shape in shapes.items():
                ch = (max(1, min(chunks[k], shape[0] or 1)), *shape[1:])
                g.create_array(k, shape=shape, dtype=sgroup[k].dtype, chunks=ch, compressors=comp)
        except Exception as exc:
            ok, err = False, exc
    comm.phase = "create store"
    _agree_ok(comm, ok, f"creating {tmp}: {err}" if err else f"creating {tmp}")
    ok, err = True, None
    try:  # every rank writes only its whole chunks
        g = zarr.open_group(str(tmp), mode="r+")
        for _part, ((lo, hi), data) in local.items():
            for k, arr in data.items():
                if hi > lo:
                    g[k][lo:hi] = arr
        _fault(rank, "write")
    except Exception as exc:
        ok, err = False, exc
    comm.phase = "write shards"
    _agree_ok(comm, ok, f"writing {tmp}: {err}" if err else f"writing {tmp}")
    ok, err, mine = True, None, np.zeros((0, 4), dtype=np.int64)
    try:  # checksums of the chunk files this rank wrote (the ranks read in parallel)
        mine = _own_chunk_records(tmp, local, chunks, shapes)
    except Exception as exc:
        ok, err = False, exc
    comm.phase = "checksums"
    _agree_ok(comm, ok, f"checksumming {tmp}: {err}" if err else f"checksumming {tmp}")
    rows = np.concatenate(comm.allgatherv(mine))
    ok, err = True, None
    if rank == 0:
        try:
            for k in STL_KEYS:
                if k in sattrs.get("arrays", {}):
                    v = np.asarray(sgroup[k][...])
                    ch = (max(1, min(target_chunk, v.shape[0] or 1)), *v.shape[1:])
                    g.create_array(k, shape=v.shape, dtype=v.dtype, chunks=ch,
                                   compressors=_compressors(compressor))  # fmt: skip
                    if v.size:
                        g[k][...] = v
                    shapes[k] = list(v.shape)
            attrs["arrays"] = shapes
            seal_store(g, tmp, attrs, _records(tmp, sorted(chunks), shapes, rows))
            publish(tmp, out, dst_dir / f"{name}.zarr.old-{token}")
        except Exception as exc:
            ok, err = False, exc
    comm.phase = "publish"
    _agree_ok(comm, ok, f"publishing {out}: {err}" if err else f"publishing {out}")
    log.info("%s: written by %d ranks", out, W)
    return "written"


def preprocess_distributed(
    src: str | Path,
    dst: str | Path,
    options: RunOptions,
    *,
    runs: Sequence[str] | None = None,
) -> dict[str, int]:
    """Every source under ``src`` (or the source ``src`` itself: run stores ``*.zarr`` and point
    sets ``*.npy``), repartitioned by all ranks together into ``dst`` (``meshshard preprocess
    ... --distributed``).

    Collective over the default group, which this initialises from the torchrun environment
    when needed, through :func:`meshshard.comm.process.init`: a rank that never arrives ends
    every collective after ``MESHSHARD_TIMEOUT`` seconds, not torch's 30 minutes.

    Parameters
    ----------
    src, dst : path
        A source or a directory of them; the new stores go to ``dst/<name>.zarr``.
    options : RunOptions
        ``parts``, ``method``, ``surface``/``volume`` (which parts to keep), ``overwrite``
        and ``compressor`` apply; ``halo_radius``, ``max_volume_cells``, ``drop_nan`` and
        ``graph`` are not implemented on this path and are refused.
    runs : sequence of str, optional
        Only the sources of these names (``run_1`` for ``run_1.zarr``).

    Returns
    -------
    dict
        ``{"written": n, "skipped": m}`` (the same on every rank).

    Raises
    ------
    ValueError
        An option this path does not implement (named), before any collective.
    FileNotFoundError
        No source under ``src``.
    """
    unsupported = [f"{name}={value!r}" for name, value, on in (
        ("halo_radius", options.halo_radius, options.halo_radius is not None),
        ("max_volume_cells", options.max_volume_cells, options.max_volume_cells is not None),
        ("drop_nan", options.drop_nan, options.drop_nan),
        ("graph", options.graph, options.graph is not None),
    ) if on]  # fmt: skip
    if unsupported:
        msg = (f"{', '.join(unsupported)}: not implemented by distributed preprocessing, which "
               "repartitions finished run stores and point sets (no cell connectivity for a "
               "graph); preprocess without it, or drop the option")
        raise ValueError(msg)
    init("gloo")  # already initialised (tests' harness): only the timeout of new groups is set
    src = Path(src)
    stores = [src] if is_source(src) else sorted(p for p in src.iterdir() if is_source(p))
    if runs:
        stores = [s for s in stores if source_name(s) in set(runs)]
    if not stores:
        msg = f"{src}: no run stores (*.zarr) or point sets (*.npy) to repartition"
        raise FileNotFoundError(msg)
    both = options.surface and options.volume
    which = None if both else ("surface",) if options.surface else ("volume",)
    counts = {"written": 0, "skipped": 0}
    for s in stores:
        got = repartition_store(
            s, dst, parts=options.parts, method=options.method, overwrite=options.overwrite,
            which=which, compressor=options.compressor,
        )  # fmt: skip
        counts[got] += 1
    log.info("distributed preprocess: %s -> %s", counts, dst)
    return counts
