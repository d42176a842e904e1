"""`meshshard partition INPUT --parts P --method M --out DIR`: cut a mesh or point cloud and
write the Partition (``partition.npz``/``partition.json``) plus ``metrics.json``."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from meshshard.cli import CLIError

METHODS = ("hilbert", "morton", "rcb", "metis")


def parse_targets(text: str | None, parts: int | None = None) -> list[float] | None:
    """``"0.5,0.25,0.25"`` -> floats; errors name ``--targets`` and say what was found."""
    if text is None:
        return None
    try:
        t = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        msg = f"--targets must be comma-separated fractions like 0.5,0.25,0.25; got {text!r}"
        raise CLIError(msg) from exc
    if parts is not None and len(t) != parts:
        msg = f"--targets has {len(t)} fraction(s) for --parts {parts}; give one per part"
        raise CLIError(msg)
    if any(not math.isfinite(x) or x < 0 for x in t):
        msg = f"--targets must be finite fractions >= 0; got {text!r}"
        raise CLIError(msg)
    if t and abs(sum(t) - 1.0) > 1e-6:
        msg = f"--targets must sum to 1, got {sum(t):.6g} ({text}); e.g. 0.5,0.25,0.25"
        raise CLIError(msg)
    return t


def check_parts(parts: int, n: int, *, allow_empty: bool, geom: Any = None) -> None:
    """``--parts`` against the number of rows, in the CLI's words (``--allow-empty``)."""
    if parts < 1:
        msg = f"--parts {parts} must be >= 1"
        raise CLIError(msg)
    if n < parts and not allow_empty:
        on_cells = geom is not None and geom.on == "cells"
        msg = (
            f"--parts {parts} but only {n} {'cell(s)' if on_cells else 'point(s)'}: some "
            "shards would be empty; pass --allow-empty (empty shards are legal) or use fewer "
            "--parts"
        )
        if on_cells and geom.mesh is not None and geom.mesh.n_points >= parts:
            msg += f", or --on points (the mesh has {geom.mesh.n_points} vertices)"
        raise CLIError(msg)


def add_geometry_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--on", choices=("cells", "points"), default=None,
        help="partition cell centres or vertices (default: cells when the mesh has cells)",
    )  # fmt: skip
    parser.add_argument(
        "--graph", choices=("dual", "knn"), default=None,
        help="graph for METIS and the metrics (default: dual on polygon or volume cells, else knn)",
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
    parser.add_argument(
        "--no-metrics", action="store_true",
        help="skip edge cut, halos and contiguity (sizes and imbalance only); with a method "
        "other than metis no graph is built at all (on big meshes the graph is most of the time)",
    )  # fmt: skip
    parser.add_argument("--png", metavar="FILE", help="also render the shards to a PNG")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from meshshard.commands._checks import check_out_dir, check_out_file
    from meshshard.commands._progress import Stages, progress_enabled
    from meshshard.partition import Partition, partition
    from meshshard.partition.io import load_geometry
    from meshshard.partition.report import format_report, render_png, report

    # everything that can be refused is refused before the expensive work
    out = Path(args.out)
    if out.exists() and not args.force:
        msg = f"{out} already exists; pass --force to overwrite it or choose another --out"
        raise CLIError(msg)
    check_out_dir(out)
    if args.png:
        check_out_file(args.png)
    if args.parts < 1:
        check_parts(args.parts, 0, allow_empty=True)
    targets = parse_targets(args.targets, args.parts)
    need_graph = args.method == "metis" or not args.no_metrics
    steps = 3 + need_graph + (not args.no_metrics) + bool(args.png)
    with Stages("meshshard partition", steps, enabled=progress_enabled(args.no_progress)) as st:
        with st.stage("read"):
            geom = load_geometry(args.input, on=args.on)
        weights = geom.field(args.weights) if args.weights else None
        check_parts(args.parts, geom.points.shape[0], allow_empty=args.allow_empty, geom=geom)
        kind = args.graph or geom.default_graph()
        graph = None
        if need_graph:
            why = "for METIS" if args.method == "metis" else "for the metrics; --no-metrics skips"
            with st.stage("graph", f"{kind}, {why}"):
                graph = geom.graph(kind, knn=args.knn)
        extra = {"seed": args.seed, "graph": graph} if args.method == "metis" else {}
        with st.stage("partition", args.method):
            part = partition(
                geom.points, args.parts, method=args.method, weights=weights, targets=targets,
                allow_empty=args.allow_empty, **extra,
            )  # fmt: skip
        params = dict(part.params)
        params.update(
            input=str(Path(args.input).resolve()), on=geom.on, graph=kind, knn=args.knn,
            weights_field=args.weights,
        )  # fmt: skip
        part = Partition(part.assignment, part.order, part.sizes, method=part.method,
                         params=params)  # fmt: skip
        if args.no_metrics:
            rep = report(part, points=geom.points, weights=weights, timings=st.timings,
                         source=geom.source)  # fmt: skip
            rep["graph_metrics"] = "skipped (--no-metrics)"
        else:
            with st.stage("metrics"):
                rep = report(part, graph=graph, points=geom.points, weights=weights,
                             timings=st.timings, source=geom.source)  # fmt: skip
        with st.stage("write"):
            part.save(out)
            tmp = out / "metrics.json.tmp"
            tmp.write_text(json.dumps(rep, indent=2, sort_keys=True))
            tmp.replace(out / "metrics.json")
        if args.png:
            with st.stage("render"):
                render_png(part, args.png, mesh=geom.mesh, points=geom.points, on=geom.on,
                           report=rep)  # fmt: skip
    rep["timings"] = dict(st.timings)
    print(json.dumps(rep, indent=2, sort_keys=True) if args.json else format_report(rep))
    if not args.json:
        wrote = [out / "partition.npz", out / "partition.json", out / "metrics.json"]
        if args.png:
            wrote.append(Path(args.png))
        print("wrote " + ", ".join(str(w) for w in wrote))
    return 0
