"""Rank functions for tests/pipelines/test_distributed_preprocess.py."""

from __future__ import annotations


def cli_rank(rank: int, world: int, argv: list[str], fault: dict | None = None) -> tuple:
    """Run ``meshshard`` with ``argv`` on this rank; (exit code or exception type, text)."""
    from meshshard.cli import main
    from meshshard.pipelines import distributed as pd

    if fault:
        pd._FAULT.update(fault)
    try:
        return main(argv), ""
    except Exception as exc:  # the test inspects it
        return type(exc).__name__, str(exc)
