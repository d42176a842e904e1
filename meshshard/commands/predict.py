"""`meshshard predict CHECKPOINT RUN --out OUT`: a trained model on one run, fields back in VTK.

The options; the work is :mod:`meshshard.commands.handlers.predict`.
"""

from __future__ import annotations

import argparse

from meshshard.commands._chunks import add_budget_args
from meshshard.commands._physics import add_physics_args


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="model checkpoint directory (model.json + weights)")
    parser.add_argument("run", help="run directory (run_<i>/ with boundary_<i>.vtp; "
                        "volume_<i>.vtu and drivaer_<i>.stl for a volume model), "
                        "meshshard store or physicsnemo-curator store")
    parser.add_argument("--out", required=True, help="output directory (OUT/<run>/...)")
    parser.add_argument("--reference-area", type=float,
                        help="A_ref for drag/lift (default: the run's geo_ref_<i>.csv aRef, "
                             "else the frontal area)")
    parser.add_argument("--no-png", action="store_true", help="skip the pressure PNG")
    add_physics_args(parser)
    add_budget_args(parser, unchunked=True)

