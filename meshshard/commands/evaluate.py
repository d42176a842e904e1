"""`meshshard evaluate RUN... [--checkpoint CKPT] --out OUT`: errors and drag/lift over runs."""

from __future__ import annotations

import argparse

from meshshard.apps.evaluate import evaluate_runs, format_table
from meshshard.apps.input_checks import check_inference_options
from meshshard.commands._checks import check_inference_args
from meshshard.commands._physics import add_physics_args, conventions_of, fields_of
from meshshard.commands._world import join_world, leave_world


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories, meshshard stores or "
                        "physicsnemo-curator stores (or directories of stores)")
    parser.add_argument("--checkpoint", action="append", help="model checkpoint; give it "
                        "twice for a surface and a volume model; without it the truth is "
                        "evaluated against itself (a check of the integration)")
    parser.add_argument("--out", required=True, help="output directory (evaluation.*)")
    parser.add_argument("--max-points-per-chunk", type=int, default=1 << 18,
                        help="points per chunk on every rank (default 262144)")
    parser.add_argument("--reference-area", type=float,
                        help="A_ref for drag/lift (default: the run's geo_ref_<i>.csv aRef, "
                             "else its frontal area)")
    parser.add_argument("--no-png", action="store_true", help="skip the PNG")
    add_physics_args(parser)


def expand(paths: list[str]) -> list:
    """Directories of stores or run directories become their members (sorted by run number)."""
    import re
    from pathlib import Path

    out = []
    for p in map(Path, paths):
        members = []
        if p.is_dir() and not (p / "zarr.json").is_file() and not re.fullmatch(r".*?\d+", p.name):
            members = [c for c in p.iterdir()
                       if re.fullmatch(r".*?\d+(\.zarr)?", c.name) and c.is_dir()]
        if members:
            key = [(int(re.findall(r"\d+", c.name)[-1]), c.name) for c in members]
            out += [c for _, c in sorted(zip(key, members))]
        else:
            out.append(p)
    return out


def run(args: argparse.Namespace) -> int:
    check_inference_args(args)
    check_inference_options(args)  # chunk floor, a finite reference area
    rank, _, mesh = join_world()
    res = evaluate_runs(expand(args.runs), args.out, checkpoint=args.checkpoint, mesh=mesh,
                        max_points_per_chunk=args.max_points_per_chunk,
                        reference_area=args.reference_area, png=not args.no_png,
                        u_inf=args.u_inf, fields=fields_of(args),
                        conventions=conventions_of(args))
    if rank == 0:
        print(format_table(res))
        for k, v in res["files"].items():
            print(f"  {k}: {v}")
    return leave_world(0)
