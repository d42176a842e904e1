"""The options ``predict`` and ``evaluate`` share: where to write, the reference area, the
PNG, what the solver's files hold (:mod:`~meshshard.commands._physics`) and the memory budgets
(:mod:`~meshshard.commands._chunks`)."""

from __future__ import annotations

import argparse

from meshshard.commands._chunks import add_budget_args
from meshshard.commands._physics import add_physics_args

__all__ = ["add_inference_args"]


def add_inference_args(parser: argparse.ArgumentParser, *, out: str, png: str,
                       unchunked: bool = False) -> None:
    """``--out`` (``out``: what it receives), ``--reference-area``, ``--no-png`` (``png``: which
    PNG), the physics options and the budgets (with ``--unchunked`` when ``unchunked``)."""
    parser.add_argument("--out", required=True, help=f"output directory ({out})")
    parser.add_argument("--reference-area", type=float,
                        help="A_ref for drag/lift (default: the run's geo_ref_<i>.csv aRef, "
                             "else its frontal area)")
    parser.add_argument("--no-png", action="store_true", help=f"skip the {png}")
    add_physics_args(parser)
    add_budget_args(parser, unchunked=unchunked)
