"""`meshshard partition INPUT --parts P --method M --out DIR`: cut a mesh or point cloud and
write the Partition (``partition.npz``/``partition.json``) plus ``metrics.json``.

This module holds the options (``add_args``) and the checks that need no heavy import; the
work is :mod:`meshshard.commands.handlers.partition`, imported when the command runs.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from meshshard.commands import CLIError
from meshshard.commands._checks import check_at_least
from meshshard.commands._methods import add_method_arg, is_graph_method
from meshshard.partition.weld import DEFAULT_WELD

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
    check_at_least("--parts", parts, 1)
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


#: ``--method`` -> (the package it needs, the extra of meshshard that installs it)
EXTRA_PACKAGES = {"kaminpar": ("kaminpar", "kaminpar"), "hypergraph": ("mtkahypar", "hypergraph")}


def missing_extra(method: str) -> CLIError:
    """The error for ``--method METHOD`` whose optional package is not installed, in the
    command's words (meshshard is installed from a checkout, not from the package index)."""
    pkg, extra = EXTRA_PACKAGES[method]
    alt = "--method metis --objective vol" if method == "hypergraph" else "--method metis"
    msg = (f"--method {method} needs the {pkg} package, which is not installed: in the "
           f"meshshard checkout run `pip install -e '.[{extra}]'` (or `pip install {pkg}`), or "
           f"use {alt}")
    return CLIError(msg)


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
