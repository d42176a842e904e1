"""The options that say what a solver's files hold: field names, conventions, flow speed."""

from __future__ import annotations

import argparse
from typing import Any

from meshshard.datasets.schema import FIELD_PRESETS, parse_field_map

__all__ = ["add_physics_args", "conventions_of", "fields_of"]


def add_physics_args(parser: argparse.ArgumentParser, *, u_inf: bool = True) -> None:
    """``--fields``, ``--normals``, ``--shear`` (and ``--u-inf`` for predict/evaluate)."""
    parser.add_argument(
        "--fields", metavar="FILE=SCHEMA,...",
        help="read the file's arrays under the schema's names, e.g. p=pMeanTrim,"
             "wallShearStress=wallShearStressMeanTrim (or a preset: "
             f"{', '.join(FIELD_PRESETS)}, OpenFOAM's p, wallShearStress, U, nut)")
    parser.add_argument(
        "--normals", choices=["auto", "into-body", "out-of-body"], default="auto",
        help="which way the surface file's cell normals point (default auto: from the "
             "closed surface's signed volume); data is held with normals into the body, "
             "as OpenFOAM writes them")
    parser.add_argument(
        "--shear", choices=["on-fluid", "on-body"], default="on-fluid",
        help="which side's stress the file's wall shear is (default on-fluid: OpenFOAM's "
             "wallShearStress, DrivaerML)")
    if u_inf:
        parser.add_argument(
            "--u-inf", type=float,
            help="free-stream speed of a run directory, m/s (default: the speed the model "
                 "was trained with, else DrivaerML's 38.889)")


def fields_of(args: argparse.Namespace) -> dict[str, str] | None:
    """The ``--fields`` map (a one-line ValueError when malformed)."""
    return None if args.fields is None else parse_field_map(args.fields)


def conventions_of(args: argparse.Namespace) -> dict[str, Any]:
    """``{"normals", "shear"}`` in the library's spelling."""
    return {"normals": args.normals.replace("-", "_"), "shear": args.shear.replace("-", "_")}
