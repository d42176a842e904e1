"""Checks a command runs before its expensive work: are its numbers in range, can it write
where it was told to?"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from meshshard.commands import CLIError
from meshshard.commands._chunks import BUDGET_FLAGS

__all__ = ["check_at_least", "check_budget_args", "check_inference_args", "check_out_dir",
           "check_out_file", "check_run_paths"]

#: what ``predict`` and ``evaluate`` read, for their messages
RUN_KINDS = ("a run directory (run_<i>/ with boundary_<i>.vtp), a meshshard store "
             "(run_<i>.zarr) or a physicsnemo-curator store")


def check_at_least(flag: str, value: float, minimum: float, hint: str = "") -> None:
    """``value`` of option ``flag`` is at least ``minimum``.

    Raises
    ------
    CLIError
        ``--steps 0 must be >= 1``, followed by `` hint`` when one is given.
    """
    if value < minimum:
        msg = f"{flag} {value} must be >= {minimum}" + (f" {hint}" if hint else "")
        raise CLIError(msg)


def _existing_ancestor(path: Path) -> Path:
    anc = path
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    return anc


def _probe(directory: Path, flag: str, target: Path) -> None:
    """Create and delete a file in ``directory``: the honest test (root, read-only mounts)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".meshshard-probe-", dir=directory)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        msg = (
            f"{flag} {target}: cannot write in {directory} ({exc.strerror}); choose a "
            "location you can write to"
        )
        raise CLIError(msg) from exc


def check_out_dir(path: str | Path, flag: str = "--out", *, shown: Path | None = None) -> Path:
    """``path`` is a directory (existing or to be created) this process can write files into.

    Raises
    ------
    CLIError
        ``path`` or an ancestor is a file, or the nearest existing directory is not writable.
    """
    p = Path(path)
    shown = shown or p
    if p.exists() and not p.is_dir():
        msg = f"{flag} {shown}: {p} exists and is not a directory; choose another {flag}"
        raise CLIError(msg)
    anc = _existing_ancestor(p)
    if not anc.is_dir():
        msg = f"{flag} {shown}: {anc} is a file, not a directory; choose another {flag}"
        raise CLIError(msg)
    _probe(anc, flag, shown)
    return p


def check_out_file(path: str | Path, flag: str = "--png", suffix: str = ".png") -> Path:
    """``path`` can be written as a new or replaced ``suffix`` file.

    Raises
    ------
    CLIError
        Wrong suffix, ``path`` is a directory, or its directory cannot be written.
    """
    p = Path(path)
    if p.suffix.lower() != suffix:
        msg = f"{flag} {p}: the file name must end in {suffix}"
        raise CLIError(msg)
    if p.is_dir():
        msg = f"{flag} {p}: is a directory; give a file name like {p / ('shards' + suffix)}"
        raise CLIError(msg)
    if p.exists() and not os.access(p, os.W_OK):
        msg = f"{flag} {p}: exists and is read-only; choose another file or fix its permissions"
        raise CLIError(msg)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        msg = f"{flag} {p}: directory {parent} does not exist; create it or choose another path"
        raise CLIError(msg)
    check_out_dir(parent, flag, shown=p)
    return p


def check_budget_args(args: Any) -> None:
    """The chunk budgets (:func:`~meshshard.commands._chunks.add_budget_args`) are >= 1 where
    given (the model's floor is :func:`~meshshard.apps.input_checks.check_inference_options`)."""
    for name, flag in BUDGET_FLAGS.items():
        if getattr(args, name) is not None:
            check_at_least(flag, getattr(args, name), 1)


def check_inference_args(args: Any) -> None:
    """The options ``predict`` and ``evaluate`` share: positive chunk budgets and a writable
    ``--out``, checked before any rank reads a file."""
    check_budget_args(args)
    check_out_dir(args.out)


def check_run_paths(paths: list[Path], what: str = "RUN") -> None:
    """Every run ``predict``/``evaluate`` was given exists and is not an empty directory,
    checked before any rank reads a file (an empty directory is not a misnamed run)."""
    for p in map(Path, paths):
        if not p.exists():
            msg = f"{what} {p}: no such file or directory; give {RUN_KINDS}"
            raise CLIError(msg)
        if p.is_dir() and not any(p.iterdir()):
            msg = f"{what} {p}: is an empty directory; give {RUN_KINDS}"
            raise CLIError(msg)
