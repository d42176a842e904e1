"""`meshshard partition`: the work (options: :mod:`meshshard.commands.partition`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from meshshard.commands import CLIError
from meshshard.commands import partition as options
from meshshard.commands._checks import check_out_dir, check_out_file
from meshshard.commands._methods import is_graph_method
from meshshard.commands._progress import Stages, progress_enabled
from meshshard.commands.partition import (
    EXTRA_PACKAGES,
    check_parts,
    merge_points,
    merge_tolerance,
    metrics_mode,
    missing_extra,
    parse_targets,
)
from meshshard.partition import Partition, partition
from meshshard.partition import hypergraph as hg
from meshshard.partition import kaminpar_part as kp
from meshshard.partition._validation import check_distance_range
from meshshard.partition.cutcount import dual_cut_metrics
from meshshard.partition.io import load_geometry
from meshshard.partition.methods import list_methods
from meshshard.partition.report import format_report, render_png, report


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
        method = kwargs.get("method")
        if method in EXTRA_PACKAGES:
            raise missing_extra(method) from exc
        raise CLIError(str(exc)) from exc


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
    why = f"above {options.AUTO_FULL_CELLS:,} cells the default" if auto else "--metrics cut"
    rep["graph_metrics"] = f"not computed ({why} counts cut faces only; --metrics full adds them)"
    return rep
