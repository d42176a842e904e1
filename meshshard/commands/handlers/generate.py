"""`meshshard generate`: the work (options: :mod:`meshshard.commands.generate`)."""

from __future__ import annotations

import argparse
import time

from meshshard.commands.generate import check_args
from meshshard.datasets.synthetic import generate_runs


def run(args: argparse.Namespace) -> int:
    numbers = check_args(args)
    t0 = time.perf_counter()
    runs = generate_runs(args.out, len(numbers), cells=args.cells,
                         volume_cells=args.volume_cells, seed=args.seed,
                         vary=not args.same_car, first_index=numbers[0])
    for r in runs:
        extra = f", {r.volume_cells:,} volume cells" if r.volume_cells else ""
        print(f"  {r.run_dir}: {r.surface_cells:,} surface cells{extra}")
    print(f"meshshard generate: {len(numbers)} run(s) in {time.perf_counter() - t0:.1f} s "
          f"-> {args.out}")
    return 0
