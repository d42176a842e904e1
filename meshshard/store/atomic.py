"""Publishing a finished file or directory under its final name, crash-safe: the one copy of
"write to a temporary name, then rename" that stores and checkpoints use.

:func:`publish` moves a complete ``tmp`` to ``path``. An existing ``path`` is moved aside to
``old`` for the instant between the two renames and deleted afterwards. The invariant: at every
instant a complete version is at ``path`` or at ``old``. In particular a leftover ``old`` from an
interrupted publish (``path`` missing) is the only good version, so it is kept until the new
one is in place; readers fall back to it (:func:`resolve`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["publish", "remove", "resolve"]


def remove(p: Path) -> None:
    """Delete a file or a directory tree (missing: nothing to do)."""
    p = Path(p)
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def publish(tmp: Path, path: Path, old: Path) -> None:
    """Rename the complete ``tmp`` to ``path``, keeping a complete version on disk throughout
    (see the module doc). ``old`` must be on the same file system (a sibling name)."""
    tmp, path, old = Path(tmp), Path(path), Path(old)
    if path.exists():
        remove(old)  # ``path`` is complete, so a leftover ``old`` is redundant
        os.replace(path, old)
    os.replace(tmp, path)  # the new version is in place; only now may ``old`` go
    remove(old)


def resolve(path: Path, old: Path) -> Path | None:
    """Where the current version is: ``path``, or ``old`` left by an interrupted publish, or
    None."""
    path, old = Path(path), Path(old)
    if path.exists():
        return path
    return old if old.exists() else None
