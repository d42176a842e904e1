"""`meshshard predict`: the work (options: :mod:`meshshard.commands.predict`)."""

from __future__ import annotations

import argparse

from meshshard.apps.input_checks import check_inference_options
from meshshard.apps.predict import predict_run
from meshshard.commands._checks import check_inference_args, check_run_paths
from meshshard.commands._chunks import budgets_of
from meshshard.commands._physics import conventions_of, fields_of
from meshshard.commands._world import join_world, leave_world


def run(args: argparse.Namespace) -> int:
    check_inference_args(args)
    check_inference_options(args)  # chunk floor, a finite reference area
    check_run_paths([args.run])
    rank, world, mesh = join_world()
    s = predict_run(args.checkpoint, args.run, args.out, mesh=mesh,
                    **budgets_of(args), png=not args.no_png, reference_area=args.reference_area,
                    u_inf=args.u_inf, fields=fields_of(args), conventions=conventions_of(args))
    if rank == 0:
        line = f"meshshard predict: {s['run']}: {s['cells']:,} cells on {world} rank(s)"
        if s.get("part") == "volume":
            line = f"meshshard predict: {s['run']}: {s['cells']:,} volume cells on {world} rank(s)"
        if "rel_l2" in s:
            errs = ", ".join(f"{k} {v:.4f}" for k, v in s["rel_l2"].items())
            line += f"; relative L2 {errs}"
        if "forces_pred" in s:
            line += (f"; Cd pred {s['forces_pred']['cd']:.4f} "
                     f"true {s['forces_true']['cd']:.4f}")
        print(line)
        for k, v in s["files"].items():
            print(f"  {k}: {v}")
    return leave_world(0)
