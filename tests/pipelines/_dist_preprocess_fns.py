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


def repartition_rank(rank: int, world: int, src, dst, parts: int, method: str,
                     splits: dict | None = None, fault: dict | None = None) -> tuple:  # fmt: skip
    """``repartition_store`` on this rank with row ``splits``: (status, "") or (exception
    type, message)."""
    from meshshard.pipelines import distributed as pd

    if fault:
        pd._FAULT.update(fault)
    try:
        return pd.repartition_store(src, dst, parts=parts, method=method, splits=splits), ""
    except Exception as exc:  # the test inspects it
        return type(exc).__name__, str(exc)
