"""`meshshard partition INPUT --parts P --method M --out DIR`: cut a mesh or point cloud and
write the Partition (``partition.npz``/``partition.json``) plus ``metrics.json``."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from meshshard.commands import CLIError
from meshshard.commands._checks import check_out_dir, check_out_file
from meshshard.commands._methods import add_method_arg, is_graph_method
from meshshard.commands._progress import Stages, progress_enabled
from meshshard.partition import Partition, partition
from meshshard.partition import hypergraph as hg
from meshshard.partition import kaminpar_part as kp
from meshshard.partition._validation import check_distance_range
from meshshard.partition.cutcount import dual_cut_metrics
from meshshard.partition.io import load_geometry
from meshshard.partition.methods import list_methods
from meshshard.partition.report import format_report, render_png, report
from meshshard.partition.weld import DEFAULT_WELD


def graph_method_options(args: argparse.Namespace) -> dict:
    """Keyword options of the graph partitioners from ``--preset``/``--seed``/``--refine``/
    ``--tries`` (checked: ``--preset`` must be one the method knows)."""
    method = args.method
    preset = getattr(args, "preset", None)
    if not is_graph_method(method):
        if preset is not None:
            msg = f"--preset is an option of --method kaminpar or hypergraph (got {method})"
            raise CLIError(msg)
        return {}
    out: dict = {"seed": getattr(args, "seed", 0)}
    if preset is not None:
        if method == "metis":
            msg = "--preset is an option of --method kaminpar or hypergraph, not metis"
            raise CLIError(msg)
        presets = hg.PRESETS if method == "hypergraph" else kp.PRESETS
        if preset not in presets:
            msg = f"--preset {preset!r} for --method {method}: choose one of {', '.join(presets)}"
            raise CLIError(msg)
        out["preset"] = preset
        if method == "hypergraph":
            out["deterministic"] = preset in hg.REPRODUCIBLE
    for key in ("refine", "tries"):
        if getattr(args, key, None) is not None:
            out[key] = getattr(args, key)
    return out
#: ``--metrics auto`` builds the whole dual graph up to this many cells (a few seconds)
AUTO_FULL_CELLS = 1_000_000


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


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (argparse turns the error into a usage line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"must be an integer >= 1, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def add_geometry_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--on", choices=("cells", "points"), default=None,
        help="partition cell centres or vertices (default: cells when the mesh has cells)",
    )  # fmt: skip
    parser.add_argument(
        "--graph", choices=("dual", "knn"), default=None,
        help="graph for METIS and the metrics (default: dual on polygon or volume cells, else knn)",
    )  # fmt: skip
    parser.add_argument(
        "--knn", type=positive_int, default=8, help="neighbours of the kNN graph (8)"
    )
    parser.add_argument(
        "--merge-tol", type=float, default=None, metavar="REL",
        help="dual graph: merge points closer than REL x the shortest edge first, so cells "
        "that share a face by coordinates are neighbours even where the file stores the "
        "face's points twice (foamToVTK gives every boundary patch its own copies); reported; "
        f"0 keeps the points apart (default {DEFAULT_WELD:g})",
    )  # fmt: skip


def merge_tolerance(args: argparse.Namespace, recorded: Any = None) -> float:
    """``--merge-tol`` (else the one a partition recorded, else the default), checked."""
    rel = args.merge_tol if args.merge_tol is not None else recorded
    rel = DEFAULT_WELD if rel is None else rel
    if not (math.isfinite(rel) and 0 <= rel < 0.5):
        msg = (
            f"--merge-tol {rel:g} must be >= 0 and < 0.5 (a fraction of the shortest edge; 0 "
            f"turns merging off; default {DEFAULT_WELD:g})"
        )
        raise CLIError(msg)
    return float(rel)


def merge_points(geom: Any, kind: str, mode: str, need_graph: bool, rel: float) -> None:
    """Merge coincident points when a dual graph will be built or cut faces counted."""
    if kind == "dual" and (need_graph or mode == "cut"):
        geom.merge_points(rel)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="mesh (.vtp .vtu .vtk .ply .stl) or points (.npy)")
    parser.add_argument("--parts", "-p", type=int, required=True, help="number of shards")
    add_method_arg(parser)
    add_geometry_args(parser)
    parser.add_argument("--weights", metavar="FIELD", help="cell/point field used as weights")
    parser.add_argument("--targets", help="fraction per shard, e.g. 0.5,0.25,0.25")
    parser.add_argument("--allow-empty", action="store_true", help="allow empty shards")
    parser.add_argument("--seed", type=int, default=0, help="seed of the graph partitioners")
    parser.add_argument(
        "--preset", default=None,
        help="kaminpar: fast, default, strong, eco, strong_rows; hypergraph: deterministic (the "
        "default), deterministic_quality, deterministic_quality_fast (these three reproducible), "
        "default, quality, highest_quality",
    )  # fmt: skip
    parser.add_argument(
        "--objective", choices=("cut", "vol"), default=None,
        help="what METIS minimises: cut (edges between shards, default) or vol (communication "
        "volume = ghost rows per halo refresh, e.g. for mesh GNNs); --method metis only",
    )  # fmt: skip
    parser.add_argument(
        "--refine", choices=("volume", "fast"), default=None,
        help="volume: after METIS, lower the ghost rows with k-way FM within the same balance "
        "(pure Python, 5-40 s per try at 1M cells); fast: the vectorised refinement (about as "
        "many rows, a fraction of the time); graph methods only",
    )  # fmt: skip
    parser.add_argument(
        "--tries", type=int, default=1,
        help="METIS runs with seeds --seed, --seed+1, ... (each refined with --refine); the "
        "fewest ghost rows (or cut edges with --objective cut and no --refine) is kept",
    )  # fmt: skip
    parser.add_argument("--out", "-o", required=True, help="output directory")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out")
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")
    parser.add_argument(
        "--metrics", choices=("auto", "full", "cut", "none"), default="auto",
        help="full: every graph metric (builds the whole graph); cut: edge cut, volume, halos "
        "and neighbours from the cells along the cuts only (dual graph; no total edges or "
        "contiguity); none: sizes and imbalance; auto (default): full up to "
        f"{AUTO_FULL_CELLS:,} cells, cut above (metis: always full)",
    )  # fmt: skip
    parser.add_argument(
        "--no-metrics", action="store_true",
        help="same as --metrics none: no graph is built unless --method metis needs one",
    )  # fmt: skip
    parser.add_argument("--png", metavar="FILE", help="also render the shards to a PNG")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
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
    mode = "none" if args.no_metrics else args.metrics
    if args.objective is not None and args.method != "metis":
        msg = f"--objective is a METIS option; add --method metis (got --method {args.method})"
        raise CLIError(msg)
    for flag, on in (("--refine", args.refine is not None), ("--tries", args.tries != 1)):
        if on and not is_graph_method(args.method):
            msg = (f"{flag} is an option of the graph methods "
                   f"({', '.join(list_methods(graph=True))}); "
                   f"got --method {args.method}")
            raise CLIError(msg)
    graph_opts = graph_method_options(args)
    rel = merge_tolerance(args)
    if args.tries < 1:
        msg = f"--tries {args.tries} must be >= 1 (METIS runs, one seed each)"
        raise CLIError(msg)
    if mode == "cut" and args.graph == "knn" and args.method != "metis":
        msg = "--metrics cut counts faces of the dual graph; with --graph knn use --metrics full"
        raise CLIError(msg)
    enabled = progress_enabled(args.no_progress)
    with Stages("meshshard partition", 6, enabled=enabled) as st:
        with st.stage("read"):
            geom = load_geometry(args.input, on=args.on)
        weights = geom.field(args.weights) if args.weights else None
        check_parts(args.parts, geom.points.shape[0], allow_empty=args.allow_empty, geom=geom)
        kind = args.graph or geom.default_graph()
        auto = mode == "auto"
        mode = metrics_mode(mode, kind, args.method, geom.points.shape[0])
        need_graph = is_graph_method(args.method) or mode == "full"
        st.set_total(3 + need_graph + (mode != "none") + bool(args.png))
        merge_points(geom, kind, mode, need_graph, rel)
        graph = None
        if need_graph and kind == "knn":  # a kd-tree on extreme coordinates: refuse, naming it
            check_distance_range(geom.points, name=str(args.input))
        if need_graph:
            why = f"for {args.method}" if is_graph_method(args.method) else "for the metrics"
            with st.stage("graph", f"{kind}, {why}"):
                graph = geom.graph(kind, knn=args.knn)
        extra = dict(graph_opts, graph=graph) if is_graph_method(args.method) else {}
        if args.objective is not None:
            extra["objective"] = args.objective
        with st.stage("partition", args.method):
            part = run_partitioner(
                partition, geom.points, args.parts, method=args.method, weights=weights,
                targets=targets, allow_empty=args.allow_empty, **extra,
            )  # fmt: skip
        params = dict(part.params)
        params.update(
            input=str(Path(args.input).resolve()), on=geom.on, graph=kind, knn=args.knn,
            weights_field=args.weights, merge_tol=rel,
        )  # fmt: skip
        part = Partition(part.assignment, part.order, part.sizes, method=part.method,
                         params=params)  # fmt: skip
        rep = build_report(part, geom, graph, weights, mode, st, auto=auto)
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


def run_partitioner(partition: Any, *args: Any, **kwargs: Any) -> Any:
    """``partition(...)``, with a missing optional partitioner (kaminpar, mtkahypar) as a
    one-line CLI error saying which extra to install."""
    try:
        return partition(*args, **kwargs)
    except ImportError as exc:
        raise CLIError(str(exc)) from exc


def metrics_mode(mode: str, kind: str, method: str, n: int) -> str:
    """``auto`` -> ``full`` or ``cut``; a graph method has its graph anyway, so ``cut`` is
    ``full``."""
    if is_graph_method(method) and mode in ("auto", "cut"):
        return "full"
    if mode == "auto":
        return "cut" if kind == "dual" and n > AUTO_FULL_CELLS else "full"
    if mode == "cut" and kind != "dual":
        msg = (
            "--metrics cut counts faces of the dual graph, and this input gets a kNN graph; "
            "use --metrics full or --no-metrics"
        )
        raise CLIError(msg)
    return mode


def build_report(
    part: Any, geom: Any, graph: Any, weights: Any, mode: str, st: Any, *, auto: bool
) -> dict:
    """The report dict for ``--metrics`` ``mode`` (full / cut / none), with the merged
    points (:meth:`~meshshard.partition.io.Geometry.merge_points`) when there were any."""
    if mode == "full":
        with st.stage("metrics"):
            rep = report(part, graph=graph, points=geom.points, weights=weights,
                         timings=st.timings, source=geom.source)  # fmt: skip
        rep.update(geom.merge_report())
        return rep
    rep = report(part, points=geom.points, weights=weights, timings=st.timings,
                 source=geom.source)  # fmt: skip
    if mode == "none":
        rep["graph_metrics"] = "skipped (--no-metrics)"
        return rep
    with st.stage("metrics", "cut faces only"):
        rep.update(dual_cut_metrics(geom.mesh, part, geom.weld))
    rep.update(geom.merge_report())
    why = f"above {AUTO_FULL_CELLS:,} cells the default" if auto else "--metrics cut"
    rep["graph_metrics"] = f"not computed ({why} counts cut faces only; --metrics full adds them)"
    return rep
