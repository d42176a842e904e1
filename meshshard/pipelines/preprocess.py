"""DrivaerML run directories -> sharded zarr stores, atomically, resumably, in parallel.

For every ``SRC/run_<i>/`` the output is ``DST/run_<i>.zarr``. A run is written under
``run_<i>.zarr.tmp-<pid>`` and renamed when finished, so a crash never leaves a partial store
under the final name. A rerun skips a run only when its store is verified up to date: complete
attributes, every array present with the recorded shape, the source files' fingerprints equal
(size, mtime, sha256 of the first and last MiB) and the same options; it removes the crashed
run's temporaries and writes again otherwise.

Parallelism: ``workers`` processes on one machine, and under ``torchrun`` (``RANK`` and
``WORLD_SIZE`` set) rank ``r`` takes runs ``r::world_size``. Two independent invocations must
not write to the same DST at the same time.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshshard.pipelines.drivaerml import file_fingerprint, read_run, run_index
from meshshard.pipelines.schema import DRIVAERML, DatasetSchema
from meshshard.pipelines.store import store_status, write_store

__all__ = ["METHODS", "RunResult", "discover_runs", "preprocess_runs", "process_run"]

log = logging.getLogger(__name__)

METHODS = ("hilbert", "morton", "rcb", "metis")


@dataclass(frozen=True)
class RunResult:
    """Outcome of one run: ``status`` is ``"written"``, ``"skipped"`` or ``"failed"``."""

    run: str
    status: str
    path: str
    seconds: float
    message: str = ""
    #: seconds per stage ("fingerprint", "read", "partition", "halo", "write")
    timings: dict = field(default_factory=dict)


def discover_runs(src: str | Path, schema: DatasetSchema = DRIVAERML) -> list[str]:
    """Names of the run directories under ``src``, sorted by run number."""
    src = Path(src)
    if not src.is_dir():
        msg = f"{src}: source directory does not exist"
        raise FileNotFoundError(msg)
    runs = []
    for p in src.iterdir():
        if p.is_dir() and p.name.startswith(schema.run_prefix):
            try:
                runs.append((run_index(p, schema), p.name))
            except ValueError:
                log.warning("%s: ignored (not named %s<number>)", p, schema.run_prefix)
    return [name for _, name in sorted(runs)]


def _safe_child(root: Path, name: str, what: str) -> Path:
    """``root / name`` when ``name`` is a plain directory entry that stays inside ``root``."""
    bad = (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or os.sep in name
        or ".." in Path(name).parts
    )
    if bad or os.path.isabs(name) or os.path.normpath(name) != name:
        msg = (
            f"{what} name {name!r} would escape {root}; run names must be plain directory "
            "names like run_1"
        )
        raise ValueError(msg)
    return root / name  # not resolved: symlinked run directories are fine


def _options(
    parts: int,
    method: str,
    surface: bool,
    volume: bool,
    halo_radius: float | None,
    drop_nan: bool,
    max_volume_cells: int | None,
) -> dict:
    if not isinstance(parts, int) or parts < 1:
        msg = f"parts={parts!r} must be an integer >= 1"
        raise ValueError(msg)
    if method not in METHODS:
        msg = f"method={method!r} is not one of {METHODS}"
        raise ValueError(msg)
    if not (surface or volume):
        msg = "nothing to do: enable the surface, the volume or both"
        raise ValueError(msg)
    if halo_radius is not None and not halo_radius > 0:
        msg = f"halo_radius={halo_radius} must be > 0 (or None for no halo routing)"
        raise ValueError(msg)
    if max_volume_cells is not None and max_volume_cells < 1:
        msg = f"max_volume_cells={max_volume_cells} must be >= 1 (or None for all)"
        raise ValueError(msg)
    return {
        "parts": parts,
        "method": method,
        "surface": bool(surface),
        "volume": bool(volume),
        "halo_radius": halo_radius,
        "drop_nan": bool(drop_nan),
        "max_volume_cells": max_volume_cells,
    }


def _sources(run_dir: Path, schema: DatasetSchema, surface: bool, volume: bool) -> dict:
    i = run_index(run_dir, schema)
    out = {}
    stl = run_dir / schema.stl_file.format(i=i)
    if stl.is_file():
        out["stl"] = file_fingerprint(stl)
    for flag, key, tmpl in (
        (surface, "surface", schema.surface_file),
        (volume, "volume", schema.volume_file),
    ):
        if flag:
            p = run_dir / tmpl.format(i=i)
            if not p.is_file():
                msg = f"{p}: missing {key} file (expected {tmpl.format(i=i)} in {run_dir})"
                raise FileNotFoundError(msg)
            out[key] = file_fingerprint(p)
    return out


def _remove_stale(dst: Path, name: str) -> None:
    for p in sorted(dst.glob(f"{name}.zarr.tmp-*")) + sorted(dst.glob(f"{name}.zarr.old-*")):
        log.warning("%s: removing a stale temporary store left by a crash", p)
        shutil.rmtree(p, ignore_errors=False) if p.is_dir() else p.unlink()


def process_run(
    run_dir: str | Path,
    dst: str | Path,
    *,
    parts: int,
    method: str = "hilbert",
    surface: bool = True,
    volume: bool = True,
    halo_radius: float | None = None,
    overwrite: bool = False,
    drop_nan: bool = False,
    max_volume_cells: int | None = None,
    schema: DatasetSchema = DRIVAERML,
    compressor: str | None = "lz4",
    graph: str | None = None,
) -> RunResult:
    """Preprocess one run directory into ``dst/<run>.zarr`` (see the module docstring).

    ``graph="dual"`` also stores the surface dual graph's shards
    (:mod:`meshshard.pipelines.graphstore`).

    Raises
    ------
    FileNotFoundError, ValueError
        Missing/corrupt inputs (named), bad options, a path escaping ``dst``, a store from a
        newer meshshard, or a finished store made with other options (pass ``overwrite``).
    """
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    dst = Path(dst)
    request = _options(parts, method, surface, volume, halo_radius, drop_nan, max_volume_cells)
    request["dataset"] = schema.to_json()
    if graph is not None:
        request["graph"] = graph
    dst.mkdir(parents=True, exist_ok=True)
    name = run_dir.name
    out = _safe_child(dst, f"{name}.zarr", "run")
    _remove_stale(dst, name)
    timings: dict[str, float] = {}
    sources = _sources(run_dir, schema, surface, volume)
    timings["fingerprint"] = time.perf_counter() - t0
    if out.exists() and not overwrite:
        reason = store_status(out, sources=sources, request=request)
        if reason is None:
            log.info("%s: up to date, skipped", out)
            return RunResult(name, "skipped", str(out), time.perf_counter() - t0)
        if reason.startswith("options changed"):
            msg = f"{out}: exists with other options ({reason}); pass --overwrite to replace it"
            raise ValueError(msg)
        log.warning("%s: rewriting (%s)", out, reason)
    t = time.perf_counter()
    data = read_run(
        run_dir,
        schema=schema,
        surface=surface,
        volume=volume,
        drop_nan=drop_nan,
        max_volume_cells=max_volume_cells,
    )
    if data.sources != sources:
        msg = f"{run_dir}: source files changed while being read; run again"
        raise RuntimeError(msg)
    timings["read"] = time.perf_counter() - t
    from meshshard.partition import halo_plan_radius, partition

    partitions: dict[str, Any] = {}
    halos: dict[str, Any] = {}
    for part, d in (("surface", data.surface), ("volume", data.volume)):
        if d is None:
            continue
        t = time.perf_counter()
        partitions[part] = partition(d.centers, parts, method=method)
        timings["partition"] = timings.get("partition", 0.0) + time.perf_counter() - t
        if halo_radius is not None:
            t = time.perf_counter()
            halos[part] = halo_plan_radius(partitions[part], d.centers, halo_radius)
            timings["halo"] = timings.get("halo", 0.0) + time.perf_counter() - t
    t = time.perf_counter()
    tmp = dst / f"{name}.zarr.tmp-{os.getpid()}"
    try:
        write_store(
            tmp,
            data,
            partitions,
            halos,
            request=request,
            dataset=schema.to_json(),
            compressor=compressor,
        )
        if graph is not None:
            from meshshard.pipelines.graphstore import write_graph

            write_graph(tmp, run_dir, partitions.get("surface"), data, graph, schema=schema)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a crash (os._exit, kill) leaves it for a rerun
        raise
    del data
    if out.exists():
        old = dst / f"{name}.zarr.old-{os.getpid()}"
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)
    timings["write"] = time.perf_counter() - t
    seconds = time.perf_counter() - t0
    log.info("%s: written in %.2f s (%s)", out, seconds, timings)
    return RunResult(name, "written", str(out), seconds, timings=timings)


def _safe_process(run_dir: str, dst: str, kwargs: dict) -> RunResult:
    t0 = time.perf_counter()
    try:
        return process_run(run_dir, dst, **kwargs)
    except Exception as exc:  # reported per run; the other runs go on
        log.error("%s: failed: %s", run_dir, exc)
        msg = f"{type(exc).__name__}: {exc}"
        return RunResult(Path(run_dir).name, "failed", "", time.perf_counter() - t0, msg)


def _init_worker(threads: int) -> None:
    """A preprocessing worker process: allocator tuning, and its share of the CPUs for the
    VTK XML reader's decompression threads (workers x threads <= CPUs)."""
    from meshshard.pipelines._alloc import tune_allocator
    from meshshard.pipelines.vtkxml import THREADS_ENV

    tune_allocator()
    os.environ[THREADS_ENV] = str(threads)


def _env_rank() -> tuple[int, int]:
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError as exc:
        msg = f"RANK/WORLD_SIZE must be integers: {exc}"
        raise ValueError(msg) from exc


def preprocess_runs(
    src: str | Path,
    dst: str | Path,
    *,
    parts: int,
    runs: Sequence[str] | None = None,
    workers: int = 1,
    rank: int | None = None,
    world_size: int | None = None,
    progress: bool | None = None,
    **options: Any,
) -> list[RunResult]:
    """Preprocess the runs under ``src`` into stores under ``dst``.

    Parameters
    ----------
    src, dst : path
        ``src`` holds ``run_<i>/`` directories; stores go to ``dst/run_<i>.zarr``.
    parts : int
        Shards per sample.
    runs : sequence of str, optional
        Run directory names (default: all under ``src``); names that would escape ``src`` or
        ``dst`` are refused.
    workers : int
        Processes on this machine (1 = in this process).
    rank, world_size : int, optional
        This rank takes runs ``rank::world_size``; default from ``RANK``/``WORLD_SIZE``.
    progress : bool, optional
        tqdm bar; default on for rank 0 when stderr is a terminal.
    **options
        Passed to :func:`process_run` (``method``, ``surface``, ``volume``, ``halo_radius``,
        ``overwrite``, ``drop_nan``, ``max_volume_cells``, ``schema``, ``compressor``).

    Returns
    -------
    list of RunResult
        One per run this rank handled, in run order; failures carry the error message.
    """
    schema = options.get("schema", DRIVAERML)
    src, dst = Path(src), Path(dst)
    _options(
        parts,
        options.get("method", "hilbert"),
        options.get("surface", True),
        options.get("volume", True),
        options.get("halo_radius"),
        options.get("drop_nan", False),
        options.get("max_volume_cells"),
    )
    if workers < 1:
        msg = f"workers={workers} must be >= 1"
        raise ValueError(msg)
    names = list(runs) if runs is not None else discover_runs(src, schema)
    dirs = [_safe_child(src, n, "run") for n in names]
    for n in names:
        _safe_child(dst, f"{n}.zarr", "run")
    env_rank, env_world = _env_rank()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        msg = f"rank={rank} out of range for world_size={world_size}"
        raise ValueError(msg)
    mine = [str(d) for d in dirs[rank::world_size]]
    if progress is None:
        progress = rank == 0 and sys.stderr.isatty()
    from tqdm.auto import tqdm

    bar = tqdm(total=len(mine), desc="preprocess", unit="run", disable=not progress)
    kwargs = dict(options, parts=parts)
    results: dict[str, RunResult] = {}
    try:
        if workers == 1 or len(mine) <= 1:
            for d in mine:
                results[d] = _safe_process(d, str(dst), kwargs)
                bar.update(1)
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor, as_completed

            ctx = mp.get_context("spawn")
            from meshshard.pipelines.vtkxml import usable_cpus

            threads = max(1, usable_cpus() // workers)
            with ProcessPoolExecutor(
                max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(threads,)
            ) as pool:
                futs = {pool.submit(_safe_process, d, str(dst), kwargs): d for d in mine}
                for f in as_completed(futs):
                    results[futs[f]] = f.result()
                    bar.update(1)
    finally:
        bar.close()
    out = [results[d] for d in mine]
    log.info(
        "rank %d/%d: %s",
        rank,
        world_size,
        json.dumps({s: sum(r.status == s for r in out) for s in ("written", "skipped", "failed")}),
    )
    return out
