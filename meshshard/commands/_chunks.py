"""The chunk-budget options of ``predict``, ``evaluate`` and ``demo``: one number, three budgets.

``--max-points-per-chunk`` bounds the model's forward and is the default of the two others,
``--max-queries-per-chunk`` (the kNN of the surface features) and ``--max-cells-per-round``
(the signed distances of the volume cells); what each bounds and costs is
:mod:`meshshard.apps.chunk_budgets`, the defaults' one home.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from meshshard.apps.chunk_budgets import DEFAULT_BUDGET, ChunkBudgets

__all__ = ["BUDGET_FLAGS", "add_budget_args", "budgets_of"]

#: each budget's option: ``--`` and its keyword, dashed (``--max-points-per-chunk``)
BUDGET_FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in fields(ChunkBudgets)}


def add_budget_args(parser: argparse.ArgumentParser, *, default: int = DEFAULT_BUDGET,
                    unchunked: bool = False) -> None:
    """``--max-points-per-chunk`` (default ``default``), ``--max-queries-per-chunk``,
    ``--max-cells-per-round`` and, with ``unchunked``, ``--unchunked``."""
    group = parser.add_argument_group(
        "memory budgets (per rank; smaller uses less memory, the results do not change)")
    group.add_argument(
        "--max-points-per-chunk", type=int, default=default, metavar="N",
        help=f"points per chunk of the model's forward, and the default of the two budgets "
             f"below (default {default})")
    group.add_argument(
        "--max-queries-per-chunk", type=int, metavar="N",
        help="kNN queries per round while the surface features are built (default: "
             "--max-points-per-chunk)")
    group.add_argument(
        "--max-cells-per-round", type=int, metavar="N",
        help="volume cells per round of the signed distances to the body (default: "
             "--max-points-per-chunk)")
    if unchunked:
        group.add_argument(
            "--unchunked", action="store_true",
            help="run the model (and every budget not given) on the whole shard at once: the "
                 "reference; more memory")


def budgets_of(args: argparse.Namespace) -> dict[str, Any]:
    """The budgets as keywords of :func:`~meshshard.apps.predict.predict_run` and
    :func:`~meshshard.apps.evaluate.evaluate_runs` (``None``: follows
    ``max_points_per_chunk``, which ``--unchunked`` makes ``None``)."""
    out = {name: getattr(args, name) for name in BUDGET_FLAGS}
    if getattr(args, "unchunked", False):
        out["max_points_per_chunk"] = None
    return out
