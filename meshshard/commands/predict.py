"""`meshshard predict CHECKPOINT RUN --out OUT`: a trained model on one run, fields back in VTK.

The options; the work is :mod:`meshshard.commands.handlers.predict`.
"""

from __future__ import annotations

import argparse

from meshshard.commands._inference import add_inference_args


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="model checkpoint directory (model.json + weights)")
    parser.add_argument("run", help="run directory (run_<i>/ with boundary_<i>.vtp; "
                        "volume_<i>.vtu and drivaer_<i>.stl for a volume model), "
                        "meshshard store or physicsnemo-curator store")
    add_inference_args(parser, out="OUT/<run>/...", png="pressure PNG", unchunked=True)

