"""`meshshard preprocess`: the work (options: :mod:`meshshard.commands.preprocess`).

A plain ``meshshard preprocess`` imports no torch in this process (nor in its workers): the
``--distributed`` path and the sum of the counts over torchrun's ranks reach torch through
:mod:`meshshard.pipelines` and :mod:`meshshard.comm`, whose names load on first use.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

from meshshard import comm, pipelines  # their torch-heavy names load on first use
from meshshard.comm.launch import launch
from meshshard.commands import CLIError
from meshshard.commands._checks import check_out_dir
from meshshard.commands._physics import conventions_of, fields_of
from meshshard.commands.partition import missing_extra
from meshshard.datasets.drivaerml import run_index
from meshshard.datasets.schema import DRIVAERML
from meshshard.partition import hypergraph
from meshshard.pipelines import RunOptions, preprocess_runs
from meshshard.pipelines._alloc import tune_allocator
from meshshard.pipelines.preprocess import discover_runs


def _options(args: argparse.Namespace) -> RunOptions:
    """The per-run options the flags ask for (checked: a bad value is a ValueError)."""
    return RunOptions(
        parts=args.parts,
        method=args.method,
        surface=not args.volume,
        volume=not args.surface,
        halo_radius=args.halo_radius,
        overwrite=args.overwrite,
        drop_nan=args.drop_nan,
        max_volume_cells=args.max_volume_cells,
        schema=replace(DRIVAERML.with_fields(fields_of(args)), u_inf=args.u_inf, rho=args.rho,
                       length=args.length, **conventions_of(args)),
        reference_area=args.reference_area,
        compressor=None if args.compressor == "none" else args.compressor,
        graph=args.graph,
        stl=args.stl,
    )


def _distributed(args: argparse.Namespace) -> int:
    """``--distributed``: the flags that path does not implement are refused (every rank, exit
    2, before any collective), then all ranks repartition together."""
    import torch.distributed as dist

    unsupported = [flag for flag, on in (
        ("--halo-radius", args.halo_radius is not None),
        ("--max-volume-cells", args.max_volume_cells is not None),
        ("--drop-nan", args.drop_nan),
        ("--workers", args.workers != 1),
        ("--stl", args.stl is not None),  # a repartitioned store keeps its source's STL
    ) if on]  # fmt: skip
    if unsupported:
        msg = f"{', '.join(unsupported)} cannot be combined with --distributed (yet)"
        raise ValueError(msg)
    if args.graph is not None:
        msg = (
            f"--graph {args.graph} cannot be combined with --distributed: the distributed path "
            "repartitions run stores and point sets, which hold no cell connectivity to build "
            "the dual graph from (and the source's graph shards do not fit the new cut); run "
            "`meshshard preprocess ... --graph dual` without --distributed"
        )
        raise ValueError(msg)
    counts = pipelines.preprocess_distributed(args.src, args.dst, _options(args),
                                              runs=args.runs)
    if dist.get_rank() == 0:
        print(
            f"meshshard preprocess --distributed: {counts['written']} written, "
            f"{counts['skipped']} skipped (up to date) on {dist.get_world_size()} ranks "
            f"-> {args.dst}"
        )
    return 0


def run(args: argparse.Namespace) -> int:

    _check_flags(args)
    # before any run is read: an unwritable DST is one user error, not one failure per run
    check_out_dir(args.dst, "DST")
    tune_allocator()  # this process is ours: keep freed arrays for reuse (see _alloc)
    if args.distributed:
        return _distributed(args)

    _check_runs(args)
    results = preprocess_runs(
        args.src,
        args.dst,
        _options(args),
        runs=args.runs,
        workers=args.workers,
        progress=False if args.no_progress else None,
    )
    failed = [r for r in results if r.status == "failed"]
    keys = ("written", "skipped", "failed")
    counts = {s: sum(r.status == s for r in results) for s in keys}
    for r in failed:
        print(f"  {r.run}{_rank_label()}: {r.message}", file=sys.stderr)
    total = _total_over_ranks([counts[k] for k in keys])
    if total is None:  # one process (or RANK/WORLD_SIZE set by hand): this rank's own runs
        print(
            f"meshshard preprocess{_rank_label()}: {counts['written']} written, "
            f"{counts['skipped']} skipped (up to date), {counts['failed']} failed -> {args.dst}"
        )
        return _exit_code(failed)
    world, sums = total
    if _rank() == 0:
        print(
            f"meshshard preprocess: {sums[0]} written, {sums[1]} skipped (up to date), "
            f"{sums[2]} failed over {world} ranks -> {args.dst}"
        )
    return _exit_code(failed)


def _check_flags(args: argparse.Namespace) -> None:
    """The numeric flags and a missing optional partitioner, refused in the command's words
    (``--parts 0``) before the options are made (whose own check speaks Python: ``parts=0``)."""
    if args.method == "hypergraph" and not hypergraph.WITH_MTKAHYPAR:
        raise missing_extra(args.method)
    for flag, value in (("--parts", args.parts), ("--workers", args.workers),
                        ("--max-volume-cells", args.max_volume_cells)):
        if value is not None and value < 1:
            msg = f"{flag} {value} must be >= 1"
            raise CLIError(msg)
    for flag, value in (("--halo-radius", args.halo_radius), ("--u-inf", args.u_inf),
                        ("--rho", args.rho), ("--length", args.length),
                        ("--reference-area", args.reference_area)):
        if value is not None and not (math.isfinite(value) and value > 0):
            msg = f"{flag} {value} must be a number > 0"
            raise CLIError(msg)


def _exit_code(failed: list) -> int:
    """0 when no run failed; 2 when every failure is the input's or the options' fault (a
    missing or damaged file, a store made with other options); 1 when a run crashed."""
    if not failed:
        return 0
    return 2 if all(r.user_error for r in failed) else 1


def _check_runs(args: argparse.Namespace) -> None:
    """What every run would refuse, said once before any worker starts: a ``--runs`` name
    that is not a run directory of SRC; a volume (asked for by default) that no run has."""
    src = Path(args.src)
    if not src.is_dir():
        return  # preprocess_runs says what SRC is
    there = discover_runs(src, DRIVAERML)
    if args.runs:
        missing = [n for n in args.runs if not (src / n).is_dir()]
        if missing:
            held = ", ".join(there[:8]) + (", ..." if len(there) > 8 else "") or "none"
            msg = (f"--runs {' '.join(missing)}: no such run directory in {src} (runs there: "
                   f"{held})")
            raise CLIError(msg)
    names = args.runs or there
    if args.surface or args.distributed or not names:
        return

    def has_volume(name: str) -> bool:
        try:
            i = run_index(src / name, DRIVAERML)
        except ValueError:
            return True  # not a run name: preprocess_runs says so
        return (src / name / DRIVAERML.volume_file.format(i=i)).exists()

    if not any(has_volume(n) for n in names):
        one = DRIVAERML.volume_file.format(i="<i>")
        which = "the run" if len(names) == 1 else f"any of the {len(names)} runs"
        msg = (f"{src}: no {one} in {which}; pass --surface to preprocess the surfaces "
               "only (a volume is preprocessed by default)")
        raise CLIError(msg)


def _rank() -> int:
    return launch().rank


def _rank_label() -> str:
    """`` [rank 2/8]`` when the launcher says there are several ranks, else ``""``."""
    return launch().label()


def _total_over_ranks(counts: list[int]) -> tuple[int, list[int]] | None:
    """Under torchrun: every rank's counts summed (a gloo all-reduce in a group made for it,
    after all the work; it waits for the slowest rank, up to a day, since ranks finish their
    runs at very different times -- torchrun ends the others when one fails). None when not
    launched by torchrun."""
    import datetime

    job = launch()
    if job.world_size < 2 or not job.rendezvous:
        return None
    import torch
    import torch.distributed as dist

    made = not dist.is_initialized()
    if made:  # a caller's own group is used as it is (its timeouts untouched)
        comm.init("gloo", timeout=datetime.timedelta(days=1))
    try:
        t = torch.tensor(counts, dtype=torch.int64)
        dist.all_reduce(t)
        return dist.get_world_size(), [int(v) for v in t.tolist()]
    finally:
        if made:
            dist.destroy_process_group()
