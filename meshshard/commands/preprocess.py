"""`meshshard preprocess drivaerml SRC DST --parts P`: runs -> partition-aware sharded zarr.

The options; the work is :mod:`meshshard.commands.handlers.preprocess`.
"""

from __future__ import annotations

import argparse

from meshshard.commands._methods import add_method_arg
from meshshard.commands._physics import add_physics_args


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", choices=["drivaerml"], help="dataset layout of SRC")
    parser.add_argument("src", help="directory holding run_<i>/ directories")
    parser.add_argument("dst", help="output directory for run_<i>.zarr stores")
    parser.add_argument("--parts", type=int, required=True, help="shards per sample")
    add_method_arg(parser, graph_note="with --graph dual, a graph method (metis, kaminpar, "
                   "hypergraph) cuts the surface's dual graph")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes on this machine, one run each at a time (every run is read in "
        "a worker, so a crashing run fails alone); more than 1 helps only with spare cores "
        "and memory (see docs/failures.md, \"When --workers helps\")",
    )
    parser.add_argument("--runs", nargs="+", help="only these run directory names")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--surface", action="store_true", help="surface only")
    g.add_argument("--volume", action="store_true", help="volume only")
    parser.add_argument(
        "--halo-radius", type=float, help="also store halo routing for this radius"
    )
    parser.add_argument(
        "--max-volume-cells", type=int, help="keep a seeded random subset of volume cells"
    )
    parser.add_argument(
        "--graph", choices=["dual"], help="also store the surface dual graph's shards (GNNs)"
    )
    parser.add_argument(
        "--stl", choices=("full", "mesh", "none"), default=None,
        help="what a store keeps of the run's STL: full (coordinates, faces, centres, areas), "
        "mesh (coordinates and faces: what volume training's SDF and DoMINO read) or none; "
        "default: full with the volume, none with --surface (DoMINO on the surface: --stl mesh)",
    )  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="rewrite finished stores")
    parser.add_argument("--drop-nan", action="store_true", help="drop cells with NaN fields")
    parser.add_argument("--u-inf", type=float, default=38.889, help="free-stream speed, m/s")
    parser.add_argument("--rho", type=float, default=1.0,
                        help="density (keep 1 for kinematic p, as incompressible OpenFOAM "
                             "writes it; the density only for fields in Pa)")
    parser.add_argument("--length", type=float,
                        help="body length for nut / (U_inf L), m (default: the run's STL "
                             "extent along x; needed for a volume without an STL)")
    parser.add_argument("--reference-area", type=float,
                        help="every run's reference area, m^2, recorded in its store "
                             "(default: the run's geo_ref_<i>.csv aRef, if any)")
    add_physics_args(parser, u_inf=False)
    parser.add_argument(
        "--compressor", default="lz4", choices=["lz4", "zstd", "none"], help="zarr codec"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="under torchrun: all ranks repartition each run store (*.zarr) or point set "
        "(*.npy, plus an optional <name>.fields.npy) in SRC together, each rank reading only "
        "its row range",
    )
