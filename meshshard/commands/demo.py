"""`meshshard demo`: generate, preprocess, inspect and train domain-parallel on built-in data."""

from __future__ import annotations

import argparse

from meshshard.apps.demo import run_demo
from meshshard.commands import CLIError
from meshshard.commands._checks import check_out_dir
from meshshard.commands._methods import add_method_arg


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo_out", help="output directory (default demo_out)")
    parser.add_argument("--cells", type=int, default=200_000, help="surface cells (~200k)")
    parser.add_argument("--parts", type=int, default=4, help="shards in the store")
    parser.add_argument("--ranks", type=int, default=2, help="gloo ranks that train")
    parser.add_argument("--steps", type=int, default=30, help="training steps")
    add_method_arg(parser)
    parser.add_argument("--no-png", action="store_true", help="skip the PNG renderings")


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--parts", args.parts), ("--ranks", args.ranks)):
        if value < 1:
            msg = f"{flag} {value} must be >= 1"
            raise CLIError(msg)
    if args.parts % args.ranks:
        msg = f"--ranks {args.ranks} must divide --parts {args.parts}"
        raise CLIError(msg)
    if args.cells < 100 or args.steps < 1:
        msg = "--cells must be >= 100 and --steps >= 1"
        raise CLIError(msg)
    check_out_dir(args.out)  # before generating anything
    summary = run_demo(args.out, cells=args.cells, parts=args.parts, ranks=args.ranks,
                       steps=args.steps, method=args.method, png=not args.no_png)
    return 0 if summary["max_rel_diff"] < 1e-3 else 1
