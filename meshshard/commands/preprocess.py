"""`meshshard preprocess drivaerml SRC DST --parts P`: runs -> partition-aware sharded zarr."""

from __future__ import annotations

import argparse
import math

from meshshard.comm.launch import launch
from meshshard.comm.process import init
from meshshard.commands._checks import check_out_dir
from meshshard.commands._methods import add_method_arg
from meshshard.commands._physics import add_physics_args, conventions_of, fields_of
from meshshard.datasets import DRIVAERML
from meshshard.pipelines import RunOptions, preprocess_runs
from meshshard.pipelines._alloc import tune_allocator
from meshshard.pipelines.distributed import preprocess_distributed


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", choices=["drivaerml"], help="dataset layout of SRC")
    parser.add_argument("src", help="directory holding run_<i>/ directories")
    parser.add_argument("dst", help="output directory for run_<i>.zarr stores")
    parser.add_argument("--parts", type=int, required=True, help="shards per sample")
    add_method_arg(parser, graph_note="with --graph dual, a graph method (metis, kaminpar, "
                   "hypergraph) cuts the surface's dual graph")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes on this machine, one run each at a time (every run is read in "
        "a worker, so a crashing run fails alone); more than 1 helps only with spare cores "
        "and memory (see docs/failures.md, \"When --workers helps\")",
    )
    parser.add_argument("--runs", nargs="+", help="only these run directory names")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--surface", action="store_true", help="surface only")
    g.add_argument("--volume", action="store_true", help="volume only")
    parser.add_argument(
        "--halo-radius", type=float, help="also store halo routing for this radius"
    )
    parser.add_argument(
        "--max-volume-cells", type=int, help="keep a seeded random subset of volume cells"
    )
    parser.add_argument(
        "--graph", choices=["dual"], help="also store the surface dual graph's shards (GNNs)"
    )
    parser.add_argument(
        "--stl", choices=("full", "mesh", "none"), default=None,
        help="what a store keeps of the run's STL: full (coordinates, faces, centres, areas), "
        "mesh (coordinates and faces: what volume training's SDF and DoMINO read) or none; "
        "default: full with the volume, none with --surface (DoMINO on the surface: --stl mesh)",
    )  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="rewrite finished stores")
    parser.add_argument("--drop-nan", action="store_true", help="drop cells with NaN fields")
    parser.add_argument("--u-inf", type=float, default=38.889, help="free-stream speed, m/s")
    parser.add_argument("--rho", type=float, default=1.0,
                        help="density (keep 1 for kinematic p, as incompressible OpenFOAM "
                             "writes it; the density only for fields in Pa)")
    parser.add_argument("--length", type=float,
                        help="body length for nut / (U_inf L), m (default: the run's STL "
                             "extent along x; needed for a volume without an STL)")
    parser.add_argument("--reference-area", type=float,
                        help="every run's reference area, m^2, recorded in its store "
                             "(default: the run's geo_ref_<i>.csv aRef, if any)")
    add_physics_args(parser, u_inf=False)
    parser.add_argument(
        "--compressor", default="lz4", choices=["lz4", "zstd", "none"], help="zarr codec"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="under torchrun: all ranks repartition each run store (*.zarr) or point set "
        "(*.npy, plus an optional <name>.fields.npy) in SRC together, each rank reading only "
        "its row range",
    )


def _options(args: argparse.Namespace) -> RunOptions:
    """The per-run options the flags ask for (checked: a bad value is a ValueError)."""
    from dataclasses import replace

    if args.length is not None and not (math.isfinite(args.length) and args.length > 0):
        msg = f"--length {args.length:g} must be > 0 (m; leave it out to take the STL's extent)"
        raise ValueError(msg)
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
    counts = preprocess_distributed(args.src, args.dst, _options(args), runs=args.runs)
    if dist.get_rank() == 0:
        print(
            f"meshshard preprocess --distributed: {counts['written']} written, "
            f"{counts['skipped']} skipped (up to date) on {dist.get_world_size()} ranks "
            f"-> {args.dst}"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    import sys

    # before any run is read: an unwritable DST is one user error, not one failure per run
    check_out_dir(args.dst, "DST")
    tune_allocator()  # this process is ours: keep freed arrays for reuse (see _alloc)
    if args.distributed:
        return _distributed(args)

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
        return 1 if failed else 0
    world, sums = total
    if _rank() == 0:
        print(
            f"meshshard preprocess: {sums[0]} written, {sums[1]} skipped (up to date), "
            f"{sums[2]} failed over {world} ranks -> {args.dst}"
        )
    return 1 if failed else 0


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
        init("gloo", timeout=datetime.timedelta(days=1))
    try:
        t = torch.tensor(counts, dtype=torch.int64)
        dist.all_reduce(t)
        return dist.get_world_size(), [int(v) for v in t.tolist()]
    finally:
        if made:
            dist.destroy_process_group()
