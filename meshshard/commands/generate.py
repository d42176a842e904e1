"""`meshshard generate RAW --runs N`: synthetic DrivaerML-like runs to try every command on.

Writes ``RAW/run_<i>/boundary_<i>.vtp`` (surface cells with ``pMeanTrim`` and
``wallShearStressMeanTrim``), optionally ``volume_<i>.vtu``, and ``drivaer_<i>.stl``: the files
and arrays of a DrivaerML run, so ``meshshard preprocess drivaerml RAW STORES`` reads them as it
reads the real dataset. Every run is a different car (length, width, height, ride height,
nose, tail, boat tail, cabin drawn per run and recorded in ``geo_parameters_<i>.csv``), so drag
varies over the runs as it does over DrivaerML's morphs. The generator is
:func:`meshshard.datasets.synthetic.generate_runs`, called by
:mod:`meshshard.commands.handlers.generate`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from meshshard.commands import CLIError
from meshshard.commands._checks import check_at_least, check_out_dir

#: fewest surface cells the generator's car body is made of
MIN_CELLS = 100


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="RAW", help="directory the run_<i>/ directories go to")
    parser.add_argument("--runs", type=int, default=4, help="how many runs (%(default)s)")
    parser.add_argument("--cells", type=int, default=50_000,
                        help="surface cells per run, about (%(default)s; DrivaerML: ~8.8M)")
    parser.add_argument("--volume-cells", type=int, default=0,
                        help="volume cells per run, about (default 0: no volume_<i>.vtu; "
                             "give one to train on the volume)")
    parser.add_argument("--first", type=int, default=1,
                        help="number of the first run (run_<first>, run_<first+1>, ...)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the shapes and the fields' noise: the same seed writes "
                             "the same runs")
    parser.add_argument("--same-car", action="store_true",
                        help="every run the baseline car (default: a different car per run)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace runs that exist (refused otherwise)")


def check_args(args: argparse.Namespace) -> list[int]:
    """The run numbers to write, after every option is checked (nothing written yet)."""
    check_at_least("--runs", args.runs, 1)
    check_at_least("--cells", args.cells, MIN_CELLS)
    check_at_least("--volume-cells", args.volume_cells, 0, "(0: no volume)")
    check_at_least("--first", args.first, 0)
    check_out_dir(args.out, "RAW")
    numbers = list(range(args.first, args.first + args.runs))
    there = [f"run_{i}" for i in numbers if (Path(args.out) / f"run_{i}").exists()]
    if there and not args.overwrite:
        msg = (f"{args.out}: {', '.join(there[:3])}{' ...' if len(there) > 3 else ''} "
               "exist already; pass --overwrite to replace them, or --first N to add runs "
               "after them")
        raise CLIError(msg)
    return numbers

