"""`meshshard demo`: the work (options: :mod:`meshshard.commands.demo`)."""

from __future__ import annotations

import argparse

from meshshard.apps.demo import run_demo
from meshshard.apps.input_checks import check_inference_options
from meshshard.commands._chunks import budgets_of
from meshshard.commands.demo import check_args


def run(args: argparse.Namespace) -> int:
    check_args(args)
    check_inference_options(args)  # the model's chunk floor
    summary = run_demo(args.out, cells=args.cells, parts=args.parts, ranks=args.ranks,
                       steps=args.steps, method=args.method, png=not args.no_png,
                       **budgets_of(args))
    return 0 if summary["max_rel_diff"] < 1e-3 else 1
