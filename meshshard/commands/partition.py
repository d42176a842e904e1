"""`meshshard partition INPUT --parts P --method M --out DIR`: cut a mesh or point cloud and
write the Partition (``partition.npz``/``partition.json``) plus ``metrics.json``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from meshshard.cli import CLIError

METHODS = ("hilbert", "morton", "rcb", "metis")


def parse_targets(text: str | None) -> list[float] | None:
    """``"0.5,0.25,0.25"`` -> floats; errors say what was found."""
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        msg = f"--targets must be comma-separated fractions like 0.5,0.25,0.25; got {text!r}"
        raise CLIError(msg) from exc


def add_geometry_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--on", choices=("cells", "points"), default=None,
        help="partition cell centres or vertices (default: cells when the mesh has cells)",
    )  # fmt: skip
    parser.add_argument(
        "--graph", choices=("dual", "knn"), default=None,
        help="graph for METIS and the metrics (default: dual on cells, knn on points)",
    )  # fmt: skip
    parser.add_argument("--knn", type=int, default=8, help="neighbours of the kNN graph (8)")


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="mesh (.vtp .vtu .vtk .ply .stl) or points (.npy)")
    parser.add_argument("--parts", "-p", type=int, required=True, help="number of shards")
    parser.add_argument("--method", "-m", choices=METHODS, default="hilbert")
    add_geometry_args(parser)
    parser.add_argument("--weights", metavar="FIELD", help="cell/point field used as weights")
    parser.add_argument("--targets", help="fraction per shard, e.g. 0.5,0.25,0.25")
    parser.add_argument("--allow-empty", action="store_true", help="allow empty shards")
    parser.add_argument("--seed", type=int, default=0, help="METIS seed")
    parser.add_argument("--out", "-o", required=True, help="output directory")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out")
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")


def run(args: argparse.Namespace) -> int:
    from meshshard.partition import Partition, partition
    from meshshard.partition.io import load_geometry
    from meshshard.partition.report import format_report, report

    out = Path(args.out)
    if out.exists() and not args.force:
        msg = f"{out} already exists; pass --force to overwrite it or choose another --out"
        raise CLIError(msg)
    if out.exists() and not out.is_dir():
        msg = f"{out} exists and is not a directory"
        raise CLIError(msg)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    geom = load_geometry(args.input, on=args.on)
    timings["read"] = time.perf_counter() - t0
    weights = geom.field(args.weights) if args.weights else None
    targets = parse_targets(args.targets)
    t0 = time.perf_counter()
    graph = geom.graph(args.graph, knn=args.knn)
    timings["graph"] = time.perf_counter() - t0
    extra = {"seed": args.seed, "graph": graph} if args.method == "metis" else {}
    t0 = time.perf_counter()
    part = partition(
        geom.points, args.parts, method=args.method, weights=weights, targets=targets,
        allow_empty=args.allow_empty, **extra,
    )  # fmt: skip
    timings["partition"] = time.perf_counter() - t0
    params = dict(part.params)
    params.update(
        input=str(Path(args.input).resolve()), on=geom.on,
        graph=args.graph or ("dual" if geom.on == "cells" else "knn"), knn=args.knn,
        weights_field=args.weights,
    )  # fmt: skip
    part = Partition(part.assignment, part.order, part.sizes, method=part.method, params=params)
    rep = report(part, graph=graph, points=geom.points, weights=weights, timings=timings,
                 source=geom.source)  # fmt: skip
    part.save(out)
    tmp = out / "metrics.json.tmp"
    tmp.write_text(json.dumps(rep, indent=2, sort_keys=True))
    tmp.replace(out / "metrics.json")
    print(json.dumps(rep, indent=2, sort_keys=True) if args.json else format_report(rep))
    if not args.json:
        print(f"wrote {out / 'partition.npz'}, {out / 'partition.json'}, {out / 'metrics.json'}")
    return 0
