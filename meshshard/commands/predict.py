"""`meshshard predict CHECKPOINT RUN --out OUT`: a trained model on one run, fields back in VTK."""

from __future__ import annotations

import argparse

from meshshard.apps.input_checks import check_inference_options
from meshshard.apps.predict import predict_run
from meshshard.commands._checks import check_inference_args
from meshshard.commands._physics import add_physics_args, conventions_of, fields_of
from meshshard.commands._world import join_world, leave_world


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="model checkpoint directory (model.json + weights)")
    parser.add_argument("run", help="run directory (run_<i>/ with boundary_<i>.vtp; "
                        "volume_<i>.vtu and drivaer_<i>.stl for a volume model), "
                        "meshshard store or physicsnemo-curator store")
    parser.add_argument("--out", required=True, help="output directory (OUT/<run>/...)")
    parser.add_argument("--max-points-per-chunk", type=int, default=1 << 18,
                        help="points per chunk on every rank (memory budget; default 262144)")
    parser.add_argument("--unchunked", action="store_true",
                        help="run the whole shard at once (the reference; more memory)")
    parser.add_argument("--reference-area", type=float,
                        help="A_ref for drag/lift (default: the run's geo_ref_<i>.csv aRef, "
                             "else the frontal area)")
    parser.add_argument("--no-png", action="store_true", help="skip the pressure PNG")
    add_physics_args(parser)


def run(args: argparse.Namespace) -> int:
    check_inference_args(args)
    check_inference_options(args)  # chunk floor, a finite reference area
    rank, world, mesh = join_world()
    s = predict_run(args.checkpoint, args.run, args.out, mesh=mesh,
                    max_points_per_chunk=None if args.unchunked else args.max_points_per_chunk,
                    png=not args.no_png, reference_area=args.reference_area,
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
