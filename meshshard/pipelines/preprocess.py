"""DrivaerML run directories -> sharded zarr stores, atomically, resumably, in parallel.

For every ``SRC/run_<i>/`` the output is ``DST/run_<i>.zarr``. A run is written under
``run_<i>.zarr.tmp-<pid>`` and renamed when finished, so a crash never leaves a partial store
under the final name. A rerun skips a run only when its store is verified up to date: complete
attributes, every array present with the recorded shape and its chunk files present with their
recorded sizes (the store's integrity record), the source files' fingerprints equal
(size, mtime, sha256 of the first and last MiB) and the same options; it removes the crashed
run's temporaries and writes again otherwise.

Processes: :func:`preprocess_runs` reads and writes every run in a worker process
(:mod:`meshshard.pipelines._workers`), ``workers`` of them at once, so a run whose reader crashes
the process (a segfault or abort inside VTK, the out-of-memory killer) fails alone, named in the
results with how its worker died, while the other runs are written. Workers die with their
parent; an exception or interrupt in the parent stops them within seconds and removes what they
left half-written. Each run is written under an advisory lock (:mod:`meshshard.pipelines._runlock`)
held by the live writer, so a temporary store is removed as stale only when its writer is dead,
and a second invocation on the same run reports it busy. Under ``torchrun`` (``RANK`` and
``WORLD_SIZE`` set) rank ``r`` takes runs ``r::world_size``.

Length (~560 lines): process_run and preprocess_runs with their worker and crash-test hooks;
the workers themselves are in :mod:`meshshard.pipelines._workers`, the options they all take
(:class:`~meshshard.pipelines.options.RunOptions`) in :mod:`meshshard.pipelines.options`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshshard.comm.launch import launch
from meshshard.datasets.drivaerml import file_fingerprint, read_run, run_index
from meshshard.datasets.graphstore import surface_dual_adjacency, write_graph
from meshshard.datasets.reference import geo_ref_path
from meshshard.datasets.schema import DRIVAERML, DatasetSchema
from meshshard.io.vtkxml import THREADS_ENV, usable_cpus
from meshshard.partition import halo_plan_radius, partition
from meshshard.partition.methods import MethodInfo, method_info, register_method, runtime_methods
from meshshard.pipelines._alloc import tune_allocator
from meshshard.pipelines._memcap import MEMORY_ENV, apply_cap, worker_budget
from meshshard.pipelines._runlock import RunBusy, run_lock
from meshshard.pipelines._workers import TaskError, WorkerDied, WorkerPool
from meshshard.pipelines.options import RunOptions
from meshshard.store.atomic import publish
from meshshard.store.format import store_status, write_store

__all__ = ["RunOptions", "RunResult", "discover_runs", "preprocess_runs",
           "process_run"]

log = logging.getLogger(__name__)

#: test hook, read in worker processes only: ``"run_2:segv"`` makes the worker that takes run_2
#: crash for real before reading it (``segv``, ``abort``, ``exit``, ``memory``; ``bigalloc``
#: reserves 12 GiB, which fails only under the workers' address-space cap)
CRASH_RUN_ENV = "MESHSHARD_TEST_CRASH_RUN"
#: test hook, read in worker processes only: a directory; each worker writes
#: ``<run>.<pid>.held`` there after writing a run's temporary store, then waits (up to 10 min)
#: for a file ``release`` there before publishing it
HOLD_ENV = "MESHSHARD_TEST_HOLD_DIR"


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
        if src.exists():
            msg = f"{src} is a file: pass the directory holding {schema.run_prefix}<number>/ runs"
        raise FileNotFoundError(msg)
    runs = []
    for p in src.iterdir():
        if p.is_dir() and p.name.startswith(schema.run_prefix):
            try:
                runs.append((run_index(p, schema), p.name))
            except ValueError:
                log.warning("%s: ignored (not named %s<number>)", p, schema.run_prefix)
    return [name for _, name in sorted(runs)]


def _no_runs_message(src: Path, schema: DatasetSchema) -> str:
    """What ``preprocess`` looked for in ``src`` and why it found nothing."""
    where = src.resolve()
    want = f"directories named {schema.run_prefix}<number> (like {schema.run_prefix}1/)"
    try:
        run_index(src, schema)
        is_run = True
    except ValueError:
        is_run = any(src.glob("*.vtp")) or any(src.glob("*.vtu"))
    if is_run:
        return (
            f"{src} looks like one run directory, not the directory holding the runs: "
            f"no {want} inside it. Pass its parent instead: `meshshard preprocess drivaerml "
            f"{src.parent} DST --runs {src.name} ...`"
        )
    entries = sorted(p.name for p in src.iterdir())
    held = "it is empty" if not entries else "it holds " + ", ".join(entries[:8])
    held += ", ..." if len(entries) > 8 else ""
    return f"no runs to preprocess: looked for {want} directly under {where}; {held}"


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
    ref = geo_ref_path(run_dir)
    if ref is not None:  # a changed reference area makes the store stale
        out["geo_ref"] = file_fingerprint(ref)
    return out


def _remove_stale(dst: Path, name: str, level: int = logging.WARNING) -> None:
    """Remove the temporaries of run ``name``; call only while holding its run lock (their
    writers are then dead). A previous store moved aside by a replacement that died between its
    two renames is put back first: it was complete."""
    out = dst / f"{name}.zarr"
    olds = sorted(dst.glob(f"{name}.zarr.old-*"))
    if olds and not out.exists():
        log.log(level, "%s: restoring it from %s (a replacement died half-way)", out, olds[-1])
        os.replace(olds.pop(), out)
    for p in sorted(dst.glob(f"{name}.zarr.tmp-*")) + olds:
        log.log(level, "%s: removing a stale temporary store left by a crash", p)
        shutil.rmtree(p, ignore_errors=False) if p.is_dir() else p.unlink()


def process_run(
    run_dir: str | Path,
    dst: str | Path,
    options: RunOptions | None = None,
    **keywords: Any,
) -> RunResult:
    """Preprocess one run directory into ``dst/<run>.zarr`` (see the module docstring).

    ``options`` is a :class:`~meshshard.pipelines.options.RunOptions`, or its fields are given
    as keywords (``parts`` required): ``process_run(run, dst, parts=4, volume=False)``.
    ``graph="dual"`` also stores the surface dual graph's shards
    (:mod:`meshshard.datasets.graphstore`); with ``method="metis"`` the surface is then cut on
    that dual graph with METIS' volume objective (the ghost rows a GNN layer moves), not on a
    kNN graph of the cell centres; with ``method="hypergraph"`` (``pip install
    meshshard[hypergraph]``) on that dual graph's refresh hypergraph, the ghost rows exactly.

    Raises
    ------
    FileNotFoundError, ValueError
        Missing/corrupt inputs (named), bad options, a path escaping ``dst``, a store from a
        newer meshshard, or a finished store made with other options (pass ``overwrite``).
    TypeError
        An unknown option keyword (the valid ones are named), or no ``parts``.
    RunBusy
        Another live process is writing this run's store.
    """
    return _process(run_dir, dst, RunOptions.from_call("process_run", options, keywords))


def _process(run_dir: str | Path, dst: str | Path, opts: RunOptions) -> RunResult:
    """:func:`process_run` with its options made, holding the run's write lock (see
    :mod:`._runlock`)."""
    run_dir, dst = Path(run_dir), Path(dst)
    out = _safe_child(dst, f"{run_dir.name}.zarr", "run")
    dst.mkdir(parents=True, exist_ok=True)
    with run_lock(dst, run_dir.name):
        return _write_run(run_dir, dst, out, opts)


def _write_run(run_dir: Path, dst: Path, out: Path, opts: RunOptions) -> RunResult:
    t0 = time.perf_counter()
    parts, method, schema, graph = opts.parts, opts.method, opts.schema, opts.graph
    surface, volume = opts.surface, opts.volume
    request = opts.request()
    name = run_dir.name
    _remove_stale(dst, name)
    timings: dict[str, float] = {}
    sources = _sources(run_dir, schema, surface, volume)
    timings["fingerprint"] = time.perf_counter() - t0
    if out.exists() and not opts.overwrite:
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
        drop_nan=opts.drop_nan,
        max_volume_cells=opts.max_volume_cells,
        reference_area=opts.reference_area,
    )
    if data.sources != sources:
        msg = f"{run_dir}: source files changed while being read; run again"
        raise RuntimeError(msg)
    timings["read"] = time.perf_counter() - t
    partitions: dict[str, Any] = {}
    halos: dict[str, Any] = {}
    dual_edges = None
    for part, d in (("surface", data.surface), ("volume", data.volume)):
        if d is None:
            continue
        t = time.perf_counter()
        kw: dict[str, Any] = {}
        if part == "surface" and graph == "dual" and method_info(method).graph:
            # a GNN's ghost rows are the dual graph's communication volume: cut that graph,
            # for that objective (METIS on a kNN graph of the centres moves up to 1.6x more;
            # the hypergraph method minimises exactly those ghost rows)
            dual_edges, kw["graph"] = surface_dual_adjacency(run_dir, d.source_index, schema)
            if method == "metis":
                kw["objective"] = "vol"
        if d.centers.shape[0] < parts:
            msg = (
                f"{run_dir}: the {part} has {d.centers.shape[0]} cells, fewer than parts={parts}: "
                f"every shard needs a cell; use at most {d.centers.shape[0]} parts"
            )
            raise ValueError(msg)
        partitions[part] = partition(d.centers, parts, method=method, **kw)
        timings["partition"] = timings.get("partition", 0.0) + time.perf_counter() - t
        if opts.halo_radius is not None:
            t = time.perf_counter()
            halos[part] = halo_plan_radius(partitions[part], d.centers, opts.halo_radius)
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
            compressor=opts.compressor,
            stl_keys=opts.stl_keys(),
        )
        if graph is not None:
            write_graph(tmp, run_dir, partitions.get("surface"), data, graph, schema=schema,
                        edges=dual_edges)  # fmt: skip
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a crash (os._exit, kill) leaves it for a rerun
        raise
    del data
    publish(tmp, out, dst / f"{name}.zarr.old-{os.getpid()}")
    timings["write"] = time.perf_counter() - t
    seconds = time.perf_counter() - t0
    log.info("%s: written in %.2f s (%s)", out, seconds, timings)
    return RunResult(name, "written", str(out), seconds, timings=timings)


def _safe_process(run_dir: str, dst: str, opts: RunOptions, hooks: bool = False) -> RunResult:
    t0 = time.perf_counter()
    try:
        if hooks:
            _test_hooks(Path(run_dir).name)
        return _process(run_dir, dst, opts)
    except Exception as exc:  # reported per run; the other runs go on
        log.error("%s: failed: %s", run_dir, exc)
        text = str(exc) or ("out of memory" if isinstance(exc, MemoryError) else "no message")
        msg = f"{type(exc).__name__}: {text}"
        if isinstance(exc, MemoryError) and run_dir not in text:
            msg += f" (while preprocessing {run_dir})"
        return RunResult(Path(run_dir).name, "failed", "", time.perf_counter() - t0, msg)


#: this worker's address-space budget (bytes beyond what it maps; None: no cap), set by
#: :func:`_init_worker`
_BUDGET: int | None = None


def _run_in_worker(run_dir: str, dst: str, opts: RunOptions) -> RunResult:
    """:func:`_safe_process` in a worker process (where the test hooks apply), under an
    address-space cap (:mod:`meshshard.pipelines._memcap`)."""
    d = Path(run_dir)
    inputs = [p for p in d.iterdir() if p.is_file()] if d.is_dir() else []
    apply_cap(_BUDGET, inputs)
    return _safe_process(run_dir, dst, opts, hooks=True)


def _test_hooks(name: str) -> None:
    crash = os.environ.get(CRASH_RUN_ENV, "")
    run, _, how = crash.partition(":")
    if run == name:
        log.error("%s=%s: crashing this worker for a test", CRASH_RUN_ENV, crash)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
        if how == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif how == "abort":
            os.abort()
        elif how == "exit":
            os._exit(3)
        elif how == "memory":
            _ = bytearray(1 << 62)  # a real MemoryError from the allocator
        elif how == "bigalloc":  # 12 GiB, never touched: fails only under the address cap
            import numpy as np

            _ = np.empty(12 << 30, dtype=np.uint8)
    hold = os.environ.get(HOLD_ENV)
    global write_store
    if hold and not getattr(write_store, "_held", False):
        write_store = _holding(write_store, Path(hold))


def _holding(write: Callable, where: Path) -> Callable:
    def held(path, *args, **kwargs):
        write(path, *args, **kwargs)
        run = Path(path).name.split(".zarr.")[0]
        (where / f"{run}.{os.getpid()}.held").write_text(str(path))
        deadline = time.monotonic() + 600
        while not (where / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    held._held = True  # type: ignore[attr-defined]
    return held


def _clean_after_worker(dst: Path, pid: int) -> None:
    """Remove what worker ``pid`` (dead now) left half-written in ``dst``: its temporaries,
    and its lock files (taking each run's lock first, so a live writer is never touched)."""
    names = {p.name.split(".zarr.")[0] for p in dst.glob(f"*.zarr.tmp-{pid}")}
    names |= {p.name.split(".zarr.")[0] for p in dst.glob(f"*.zarr.old-{pid}")}
    for p in dst.glob("*.zarr.lock"):
        try:
            if p.read_text().startswith(f"pid {pid} "):
                names.add(p.name[: -len(".zarr.lock")])
        except OSError:
            continue
    for name in sorted(names):
        try:
            with run_lock(dst, name):
                _remove_stale(dst, name, logging.INFO)
        except RunBusy:
            continue


def _parent_logging() -> tuple[int, str | None]:
    """The root logger's level and first handler's format, for the workers to copy."""
    root = logging.getLogger()
    fmt = None
    if root.handlers and root.handlers[0].formatter is not None:
        fmt = root.handlers[0].formatter._fmt
    return root.level, fmt


def _worker_methods(method: str) -> dict[str, MethodInfo]:
    """The runtime-registered method the workers must know, checked to travel by reference."""
    methods = {k: v for k, v in runtime_methods().items() if k == method}
    for m in methods.values():
        name = getattr(m.target, "__qualname__", "")
        if callable(m.target) and ("<" in name or getattr(m.target, "__module__", None) is None):
            msg = (f"method {m.name!r} is {name or m.target!r}, which preprocessing workers "
                   "(separate processes) cannot import: define it at a module's top level, "
                   "register it as 'module:function', or pass isolate=False")
            raise ValueError(msg)
    return methods


def _init_worker(
    threads: int,
    log_setup: tuple[int, str | None] = (logging.WARNING, None),
    budget: int | None = None,
    methods: dict[str, MethodInfo] | None = None,
) -> None:
    """A preprocessing worker process: the parent's logging, allocator tuning, its share of
    the CPUs for the VTK XML reader's decompression threads (workers x threads <= CPUs), its
    address-space budget, and the partition methods the parent registered at runtime."""
    global _BUDGET
    _BUDGET = budget
    for m in (methods or {}).values():
        register_method(m.name, m.target, graph=m.graph, extra=m.extra, summary=m.summary,
                        override=True)
    level, fmt = log_setup
    if fmt is not None:
        logging.basicConfig(level=level, format=fmt)
    else:
        logging.getLogger().setLevel(level)
    tune_allocator()
    os.environ[THREADS_ENV] = str(threads)
    try:  # numcodecs guards Blosc with a multiprocessing.Lock: a named semaphore that a crashed
        # worker leaks (Python then warns at exit). Within one process a thread lock serves.
        import threading

        from numcodecs import blosc

        if not blosc._MUTEX_IS_INIT:
            blosc._MUTEX, blosc._MUTEX_IS_INIT = threading.Lock(), True
    except (ImportError, AttributeError):
        pass


def _remove_if_empty(dst: Path) -> None:
    """Remove ``dst`` (made by this call) when no run left anything in it: a failed or
    interrupted first run leaves no empty output directory behind. Another rank writing into
    it keeps it (the removal of a non-empty directory fails, and is ignored)."""
    try:
        dst.rmdir()
    except OSError:
        pass


def preprocess_runs(
    src: str | Path,
    dst: str | Path,
    options: RunOptions | None = None,
    *,
    runs: Sequence[str] | None = None,
    workers: int = 1,
    rank: int | None = None,
    world_size: int | None = None,
    progress: bool | None = None,
    isolate: bool = True,
    **keywords: Any,
) -> list[RunResult]:
    """Preprocess the runs under ``src`` into stores under ``dst``.

    Parameters
    ----------
    src, dst : path
        ``src`` holds ``run_<i>/`` directories; stores go to ``dst/run_<i>.zarr``.
    options : RunOptions, optional
        What is done with every run (:class:`~meshshard.pipelines.options.RunOptions`:
        ``parts``, ``method``, ``surface``, ``volume``, ``halo_radius``, ``overwrite``,
        ``drop_nan``, ``max_volume_cells``, ``schema``, ``compressor``, ``graph``), checked
        before any run starts; or give its fields as keywords instead
        (``preprocess_runs(src, dst, parts=4, volume=False)``).
    runs : sequence of str, optional
        Run directory names (default: all under ``src``); names that would escape ``src`` or
        ``dst`` are refused.
    workers : int
        Worker processes on this machine, each taking one run at a time. Every run is read in
        a worker, also with ``workers=1``, so that a crash fails only that run.
    isolate : bool
        False: process the runs in this process instead (``workers`` must be 1); a crash
        inside a reader then ends the whole call. For debugging.
    rank, world_size : int, optional
        This rank takes runs ``rank::world_size``; default from ``RANK``/``WORLD_SIZE``.
    progress : bool, optional
        tqdm bar; default on for rank 0 when stderr is a terminal.
    **keywords
        The fields of :class:`~meshshard.pipelines.options.RunOptions` (``parts`` required)
        when ``options`` is not given; another name is a TypeError before any run starts.

    Returns
    -------
    list of RunResult
        One per run this rank handled, in run order; failures carry the error message (for a
        worker that crashed: which signal or exit status ended it).

    Raises
    ------
    FileNotFoundError
        ``src`` is missing, or holds no run directories (the message says what was looked
        for and notices a run directory passed in place of its parent).
    ValueError, TypeError
        Bad options (see :class:`~meshshard.pipelines.options.RunOptions`), before any worker
        starts, not once per run inside each.
    """
    opts = RunOptions.from_call("preprocess_runs", options, keywords)
    schema = opts.schema
    src, dst = Path(src), Path(dst)
    if workers < 1:
        msg = f"workers={workers} must be >= 1"
        raise ValueError(msg)
    if not isolate and workers != 1:
        msg = f"isolate=False runs in this process: workers={workers} must be 1"
        raise ValueError(msg)
    names = list(runs) if runs is not None else discover_runs(src, schema)
    if runs is None and not names:
        raise FileNotFoundError(_no_runs_message(src, schema))
    dirs = [_safe_child(src, n, "run") for n in names]
    for n in names:
        _safe_child(dst, f"{n}.zarr", "run")
    created = not dst.exists()  # removed again if nothing is written into it
    job = launch()
    rank = job.rank if rank is None else rank
    world_size = job.world_size if world_size is None else world_size
    if not 0 <= rank < world_size:
        msg = f"rank={rank} out of range for world_size={world_size}"
        raise ValueError(msg)
    mine = [str(d) for d in dirs[rank::world_size]]
    if progress is None:
        progress = rank == 0 and sys.stderr.isatty()
    from tqdm.auto import tqdm

    bar = tqdm(total=len(mine), desc="preprocess", unit="run", disable=not progress)
    results: dict[str, RunResult] = {}
    try:
        if not isolate:
            for d in mine:
                results[d] = _safe_process(d, str(dst), opts)
                bar.update(1)
        elif mine:
            n = min(workers, len(mine))
            threads = max(1, usable_cpus() // n)
            budget = worker_budget(n)
            pool = WorkerPool(
                n,
                initializer=_init_worker,
                initargs=(threads, _parent_logging(), budget, _worker_methods(opts.method)),
                on_exit=functools.partial(_clean_after_worker, dst),
            )
            with pool:
                tasks = [(d, str(dst), opts) for d in mine]
                for i, got in pool.imap_unordered(_run_in_worker, tasks):
                    if isinstance(got, (WorkerDied, TaskError)):
                        text = got.message if isinstance(got, WorkerDied) else str(got)
                        if isinstance(got, WorkerDied) and budget is not None:
                            text += (f"; its address space was capped at {budget / 2**30:.1f} "
                                     f"GiB beyond its files ({MEMORY_ENV})")  # fmt: skip
                        msg = f"{text} while preprocessing {mine[i]}; the other runs went on"
                        secs = got.seconds if isinstance(got, WorkerDied) else 0.0
                        got = RunResult(Path(mine[i]).name, "failed", "", secs, msg)
                    results[mine[i]] = got
                    bar.update(1)
    finally:
        bar.close()
        if created and world_size == 1:  # (ranks share dst: one might be about to write)
            _remove_if_empty(dst)
    out = [results[d] for d in mine]
    log.info(
        "rank %d/%d: %s",
        rank,
        world_size,
        json.dumps({s: sum(r.status == s for r in out) for s in ("written", "skipped", "failed")}),
    )
    return out
