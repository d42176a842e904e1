"""`meshshard inspect DIR|INPUT|STORE.zarr`: a gpmetis-like quality report (``--json`` for
machines, ``--png`` for people).

The options; the work is :mod:`meshshard.commands.handlers.inspect`.
"""

from __future__ import annotations

import argparse

from meshshard.commands._methods import add_method_arg
from meshshard.commands.partition import AUTO_FULL_CELLS, add_geometry_args


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        help="a directory written by `meshshard partition`, a mesh/points file to partition "
        "on the fly (with --parts), or a run_i.zarr store",
    )
    parser.add_argument("--parts", "-p", type=int, help="shards (when TARGET is a mesh file)")
    add_method_arg(parser, default=None, suffix=" (when TARGET is a mesh file)")
    parser.add_argument("--preset", default=None,
                        help="preset of --method kaminpar or hypergraph (see partition --help)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the graph partitioners")
    parser.add_argument("--targets", help="fraction per shard (when TARGET is a mesh file)")
    parser.add_argument("--input", help="geometry for a partition directory (default: recorded)")
    add_geometry_args(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--allow-empty", action="store_true", help="allow empty shards")
    parser.add_argument(
        "--metrics", choices=("auto", "full", "cut"), default="auto",
        help="full: every graph metric; cut: edge cut, volume, halos and neighbours from the "
        "cells along the cuts (dual graph only); auto (default): full up to "
        f"{AUTO_FULL_CELLS:,} cells, cut above (stores: always a full kNN graph)",
    )  # fmt: skip
    parser.add_argument("--png", metavar="FILE", help="render the shards to a PNG (off-screen)")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="STORE: recompute the crc32 of every chunk file against the store's record "
        "(exit status 2 and the first difference when it is damaged); a physicsnemo-curator "
        "store has no record: every chunk is checked present, decoding and finite",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
