"""Checks a command runs before its expensive work: can it write where it was told to?"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from meshshard.commands import CLIError

__all__ = ["check_inference_args", "check_out_dir", "check_out_file"]


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


def check_inference_args(args: Any) -> None:
    """The options ``predict`` and ``evaluate`` share: a positive chunk budget and a writable
    ``--out``, checked before any rank reads a file."""

    if args.max_points_per_chunk < 1:
        msg = f"--max-points-per-chunk {args.max_points_per_chunk} must be >= 1"
        raise CLIError(msg)
    check_out_dir(args.out)
