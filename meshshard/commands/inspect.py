"""`meshshard inspect DIR|INPUT|STORE.zarr`: a gpmetis-like quality report (``--json`` for
machines, ``--png`` for people)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshshard.commands import CLIError
from meshshard.commands._checks import check_out_file
from meshshard.commands._methods import add_method_arg, is_graph_method
from meshshard.commands._progress import Stages, progress_enabled
from meshshard.commands.partition import (
    AUTO_FULL_CELLS,
    add_geometry_args,
    build_report,
    check_parts,
    graph_method_options,
    merge_points,
    merge_tolerance,
    metrics_mode,
    parse_targets,
    run_partitioner,
)
from meshshard.partition import Partition, knn_graph, partition
from meshshard.partition._validation import check_distance_range
from meshshard.partition.io import MESH_SUFFIXES, load_geometry
from meshshard.partition.report import format_report, render_png, report
from meshshard.store.curator_checks import is_curator_store, verify_curator_store
from meshshard.store.format import store_surfels, verify_store


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


def _readable(key: str, value: object) -> tuple[str, object]:
    """A store-report entry for people: times as dates, hashes shortened, sizes with units
    (``--json`` keeps the raw values)."""
    if key.endswith("mtime_ns") and isinstance(value, int):
        from datetime import datetime, timezone

        when = datetime.fromtimestamp(value / 1e9, tz=timezone.utc)
        return key[: -len("_ns")], when.strftime("%Y-%m-%d %H:%M:%S UTC")
    if key in ("sha256", "crc32", "hash", "digest") and isinstance(value, str) and len(value) > 16:
        return key, value[:12] + "..."
    if key == "size" and isinstance(value, int):
        return key, _bytes(value)
    return key, value


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _format_tree(d: dict, indent: int = 0) -> list[str]:
    """Indented ``key: value`` lines of a nested dict; long lists are shortened."""
    pad = "  " * indent
    lines = []
    for key, value in d.items():
        key, value = _readable(str(key), value)
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines.extend(_format_tree(value, indent + 1))
        elif isinstance(value, (list, tuple)) and len(value) > 8:
            head = ", ".join(str(v) for v in value[:8])
            lines.append(f"{pad}{key}: [{head}, ...] ({len(value)} items)")
        else:
            lines.append(f"{pad}{key}: {value}")
    return lines


def _inspect_curator(path: Path, args: argparse.Namespace) -> int:
    """A physicsnemo-curator store: ``--verify`` checks what its layout allows (it records
    no checksums); without it, a one-line pointer."""
    if not args.verify:
        msg = (f"{path}: a physicsnemo-curator store; inspect reports meshshard stores: pass "
               "--verify to check every chunk of it (present, decoding, finite; the layout has "
               "no checksums), or convert it with meshshard preprocess")
        raise CLIError(msg)
    res = verify_curator_store(path)  # StoreError: exit 2, naming the array
    if args.json:
        print(json.dumps({"store": str(path), "verified": res}, indent=2))
    else:
        print(f"{path}: physicsnemo-curator store, {len(res['arrays'])} arrays verified "
              f"(checksums: {res['checksums']})")
        for k, v in res["arrays"].items():
            print(f"  {k}: {tuple(v['shape'])} {v['dtype']}, {v['chunks']} chunk(s)")
    return 0


def _inspect_store(path: Path, args: argparse.Namespace) -> int:
    """``run_i.zarr``: the pipelines' store summary, then a partition report per stored part
    (surface, volume) on the kNN graph of its cell centres (stores keep no connectivity)."""
    if is_curator_store(path):
        return _inspect_curator(path, args)
    try:  # deferred: a failing store reader becomes this command's one-line error
        from meshshard.store.format import inspect_store, store_partition
    except ImportError as exc:
        msg = f"{path}: inspecting zarr stores needs meshshard.store.format ({exc})"
        raise CLIError(msg) from exc
    verified = None
    if args.verify:
        verified = verify_store(path)  # StoreError (a ValueError): exit 2, naming the damage
    summary = inspect_store(path)
    if verified is not None:
        summary["verified"] = verified
    out: dict = {"store": summary}
    shown = None
    names = [n for n in ("surface", "volume") if isinstance(summary.get(n), dict)]
    enabled = progress_enabled(args.no_progress)
    with Stages("meshshard inspect", 3 * len(names) + bool(args.png), enabled=enabled) as st:
        for name in names:
            with st.stage(f"{name} read"):
                part, points = store_partition(path, name)
            check_distance_range(points, name=f"{path} ({name}_mesh_centers)")
            with st.stage(f"{name} graph", f"kNN-{args.knn}"):
                graph = knn_graph(points, args.knn)
            with st.stage(f"{name} metrics"):
                out[name] = report(part, graph=graph, points=points,
                                   timings={"graph": st.timings[f"{name} graph"]},
                                   source=f"{path} [{name}]")  # fmt: skip
            shown = shown or (part, points, out[name], name)
        if args.png:
            if shown is None:
                msg = f"{path}: no surface or volume part to render"
                raise CLIError(msg)
            with st.stage("render"):
                surfels = {}
                if shown[3] == "surface":  # cells drawn as oriented patches, not dots
                    surfels = dict(zip(("normals", "areas"), store_surfels(path)))
                render_png(shown[0], args.png, points=shown[1], report=shown[2],
                           solid=shown[3] == "volume", **surfels)  # fmt: skip
            out["png"] = str(args.png)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True, default=str))
        return 0
    print(f"meshshard store report: {path}")
    print("\n".join(_format_tree(summary, 1)))
    for name in ("surface", "volume"):
        if name in out:
            print(format_report(out[name]))
    if args.png:
        print(f"wrote {args.png} ({shown[3]} shards)")
    return 0


def _refuse_partition_options(target: Path, args: argparse.Namespace, what: str) -> None:
    """A store or a partition directory holds its partition: options that would make one
    are refused rather than ignored."""
    options = (("--parts", args.parts), ("--method", args.method), ("--preset", args.preset),
               ("--targets", args.targets), ("--allow-empty", args.allow_empty or None))
    given = [flag for flag, v in options if v is not None]
    if given:
        msg = (
            f"{target}: is {what}, which holds its partition already; {', '.join(given)} "
            "apply only to a mesh or points file (to cut a store again: meshshard preprocess "
            "... --parts P --overwrite)"
        )
        raise CLIError(msg)


def run(args: argparse.Namespace) -> int:
    target = Path(args.target)
    if args.png:
        check_out_file(args.png)
    if not target.exists():
        msg = (
            f"{args.target}: no such file or directory; give a directory written by "
            "`meshshard partition --out`, a run_i.zarr store, or a mesh/points file "
            f"({' '.join(MESH_SUFFIXES)} .npy) with --parts P"
        )
        raise CLIError(msg)
    if target.suffix == ".zarr" or (target / "zarr.json").is_file():
        _refuse_partition_options(target, args, "a store")
        return _inspect_store(target, args)
    if target.is_dir():
        _refuse_partition_options(target, args, "a partition directory")
    method = args.method or "hilbert"
    enabled = progress_enabled(args.no_progress)
    with Stages("meshshard inspect", 5, enabled=enabled) as st:
        if target.is_dir():
            part = Partition.load(target)
            src = args.input or part.params.get("input")
            if not src:
                msg = f"{target}: no input path recorded; pass --input MESH to compute the metrics"
                raise CLIError(msg)
            on = args.on or part.params.get("on")
            with st.stage("read"):
                geom = load_geometry(src, on=on)
            if geom.points.shape[0] != part.num_points:
                msg = (
                    f"{src} gives {geom.points.shape[0]} {geom.on} but the partition in "
                    f"{target} has {part.num_points} rows; pass the matching --input/--on"
                )
                raise CLIError(msg)
            kind = args.graph or part.params.get("graph")
            knn = args.knn if args.graph else int(part.params.get("knn", args.knn))
            rel = merge_tolerance(args, part.params.get("merge_tol"))
        else:
            if args.parts is None:
                msg = (
                    f"{target} is a mesh/points file: pass --parts P (and --method) to "
                    "partition it"
                )
                raise CLIError(msg)
            targets = parse_targets(args.targets, args.parts)
            rel = merge_tolerance(args)
            with st.stage("read"):
                geom = load_geometry(target, on=args.on)
            check_parts(args.parts, geom.points.shape[0], allow_empty=args.allow_empty, geom=geom)
            kind, knn = args.graph, args.knn
            part = None
        kind = kind or geom.default_graph()
        method = method if part is None else ""  # "": nothing to partition here
        auto = args.metrics == "auto"
        mode = metrics_mode(args.metrics, kind, method, geom.points.shape[0])
        need_graph = mode == "full" or is_graph_method(method)
        st.set_total(2 + need_graph + (part is None) + bool(args.png))
        merge_points(geom, kind, mode, need_graph, rel)
        graph = None
        if need_graph and kind == "knn":  # a kd-tree on extreme coordinates: refuse, naming it
            check_distance_range(geom.points, name=str(geom.source or target))
        if need_graph:
            with st.stage("graph", kind):
                graph = geom.graph(kind, knn=knn)
        if part is None:
            extra = dict(graph_method_options(args), graph=graph) \
                if is_graph_method(method) else {}
            with st.stage("partition", method):
                part = run_partitioner(
                    partition, geom.points, args.parts, method=method, targets=targets,
                    allow_empty=args.allow_empty, **extra,
                )  # fmt: skip
        weights_field = part.params.get("weights_field")
        weights = geom.field(weights_field) if weights_field else None
        rep = build_report(part, geom, graph, weights, mode, st, auto=auto)
        if args.png:
            with st.stage("render"):
                render_png(part, args.png, mesh=geom.mesh, points=geom.points, on=geom.on,
                           report=rep)  # fmt: skip
            rep["png"] = str(args.png)
    rep["timings"] = dict(st.timings)
    print(json.dumps(rep, indent=2, sort_keys=True) if args.json else format_report(rep))
    if args.png and not args.json:
        print(f"wrote {args.png}")
    return 0
