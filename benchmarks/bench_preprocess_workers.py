"""`meshshard preprocess` end to end: the cost of reading each run in a worker process, and
when more workers help.

    python benchmarks/bench_preprocess_workers.py                      # 4 runs x 1M surface cells
    python benchmarks/bench_preprocess_workers.py --runs 2 --cells 200000   # quick

Every variant is a fresh process on the same generated runs (written once, then reused from
the page cache), best of ``--repeat`` with the variants interleaved: the command with
``--workers 1, 2, 4`` (every run read in a worker process), against the same runs preprocessed
in one process with ``preprocess_runs(isolate=False)`` (no worker: the cost of process isolation
is the difference). Wall time, and CPU time of the process and its children.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_INPROC = r"""
import sys
from meshshard.pipelines import preprocess_runs
from meshshard.pipelines._alloc import tune_allocator
tune_allocator()  # as `meshshard preprocess` does
res = preprocess_runs(sys.argv[1], sys.argv[2], parts=8, volume=False, isolate=False,
                      progress=False)
assert all(r.status == "written" for r in res), res
"""


def _timed(cmd: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"{cmd} failed:\n{proc.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--cells", type=int, default=1_000_000, help="surface cells per run")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=2, help="best of N")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory() if args.dir is None else None
    root = Path(tmp.name) if tmp else args.dir
    src, out = root / "src", root / "out"
    gen = [
        sys.executable,
        "-c",
        "import sys\nfrom meshshard.datasets import make_synthetic_run\n"
        "for i in range(1, int(sys.argv[2]) + 1):\n"
        "    if not (__import__('pathlib').Path(sys.argv[1]) / f'run_{i}').is_dir():\n"
        "        make_synthetic_run(sys.argv[1], i, surface_cells=int(sys.argv[3]), "
        "volume_cells=0, seed=i)\n",
        str(src),
        str(args.runs),
        str(args.cells),
    ]
    subprocess.run(gen, check=True)
    variants = {"in-process, isolate=False": [sys.executable, "-c", _INPROC, str(src), str(out)]}
    for w in (int(x) for x in args.workers.split(",")):
        variants[f"meshshard preprocess --workers {w}"] = [
            sys.executable, "-m", "meshshard", "preprocess", "drivaerml", str(src), str(out),
            "--parts", "8", "--surface", "--no-progress", "--workers", str(w),
        ]  # fmt: skip
    rows: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):  # variants interleaved, so a busy spell hits them alike
        for name, cmd in variants.items():
            shutil.rmtree(out, ignore_errors=True)
            got = _timed(cmd)
            print(f"  {name:40s} wall {got[0]:6.2f} s   CPU {got[1]:6.2f} s", flush=True)
            if name not in rows or got[0] < rows[name][0]:
                rows[name] = got
    print("best:")
    for name, (wall, cpu) in rows.items():
        print(f"{name:40s} wall {wall:6.2f} s   CPU {cpu:6.2f} s")
    base = rows["in-process, isolate=False"][0]
    print(
        json.dumps(
            {
                "runs": args.runs,
                "cells": args.cells,
                "cpus": len(os.sched_getaffinity(0)),
                "wall_over_in_process": {k: round(v[0] / base, 3) for k, v in rows.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
