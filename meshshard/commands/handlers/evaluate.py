"""`meshshard evaluate`: the work (options: :mod:`meshshard.commands.evaluate`)."""

from __future__ import annotations

import argparse

from meshshard.apps.evaluate import evaluate_runs, format_table
from meshshard.apps.input_checks import check_inference_options
from meshshard.commands._checks import check_inference_args, check_run_paths
from meshshard.commands._chunks import budgets_of
from meshshard.commands._physics import conventions_of, fields_of
from meshshard.commands._world import join_world, leave_world
from meshshard.commands.evaluate import expand


def run(args: argparse.Namespace) -> int:
    check_inference_args(args)
    check_inference_options(args)  # chunk floor, a finite reference area
    runs = expand(args.runs)
    check_run_paths(runs)
    rank, _, mesh = join_world()
    res = evaluate_runs(runs, args.out, checkpoint=args.checkpoint, mesh=mesh,
                        **budgets_of(args),
                        reference_area=args.reference_area, png=not args.no_png,
                        u_inf=args.u_inf, fields=fields_of(args),
                        conventions=conventions_of(args))
    if rank == 0:
        print(format_table(res))
        for k, v in res["files"].items():
            print(f"  {k}: {v}")
    return leave_world(0)
