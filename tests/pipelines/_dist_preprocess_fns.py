"""Rank functions for tests/pipelines/test_distributed_preprocess.py."""

from __future__ import annotations

import contextlib
import io


def cli_rank(rank: int, world: int, argv: list[str], fault: dict | None = None) -> tuple:
    """Run ``meshshard`` with ``argv`` on this rank: (exit code, its stderr when nonzero) or
    (exception type, message)."""
    from meshshard.cli import main
    from meshshard.pipelines import distributed as pd

    if fault:
        pd._FAULT.update(fault)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            rc = main(argv)
    except Exception as exc:  # the test inspects it
        return type(exc).__name__, str(exc)
    return rc, err.getvalue() if rc else ""
