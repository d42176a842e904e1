"""`meshshard demo`: generate, preprocess, inspect and train domain-parallel on built-in data.

The options and their checks; the work is :mod:`meshshard.commands.handlers.demo`.
"""

from __future__ import annotations

import argparse

from meshshard.apps.chunk_budgets import DEMO_BUDGET
from meshshard.commands import CLIError
from meshshard.commands._checks import check_at_least, check_budget_args, check_out_dir
from meshshard.commands._chunks import add_budget_args
from meshshard.commands._methods import add_method_arg

#: the default of --steps (:data:`meshshard.apps.demo.DEMO_STEPS`; kept here as a literal so
#: building the parser imports no training code)
DEMO_STEPS = 90


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo_out", help="output directory (default demo_out)")
    parser.add_argument("--cells", type=int, default=200_000, help="surface cells (~200k)")
    parser.add_argument("--parts", type=int, default=4, help="shards in the store")
    parser.add_argument("--ranks", type=int, default=2, help="gloo ranks that train")
    parser.add_argument("--steps", type=int, default=DEMO_STEPS,
                        help=f"training steps (default {DEMO_STEPS}: enough for the drag of an "
                        "unseen car)")
    add_method_arg(parser)
    parser.add_argument("--no-png", action="store_true", help="skip the PNG renderings")
    add_budget_args(parser, default=DEMO_BUDGET)  # for its predict and evaluate


def check_args(args: argparse.Namespace) -> None:
    """Every option checked, and ``--out`` writable, before anything is generated."""
    check_at_least("--parts", args.parts, 1)
    check_at_least("--ranks", args.ranks, 1)
    if args.parts % args.ranks:
        msg = f"--ranks {args.ranks} must divide --parts {args.parts}"
        raise CLIError(msg)
    check_at_least("--cells", args.cells, 100)
    check_at_least("--steps", args.steps, 1)
    check_budget_args(args)
    check_out_dir(args.out)
