"""A crash injected at each step of save -> fall-back -> save, for any checkpoint kind.

A kill runs no clean-up, so a crash here is a ``Crash`` (a BaseException that ``except
Exception`` does not catch) raised at one step of a save; what is left on disk is all that a
restarted process sees, so the chain goes on in the same process.

The steps of a save: writing the temporary (``write``), then :func:`meshshard.store.atomic.publish`
-- ``remove-old`` (a leftover ``PATH.old``), ``path->old``, ``tmp->path``, ``drop-old``. A crash
happens *before* a step, or, for the two removals, *half way through* it (a tree half deleted).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

STEPS = ("write", "remove-old", "path->old", "tmp->path", "drop-old")
#: every place a save can be killed; None: the save finishes
CRASHES: tuple[tuple[str, str] | None, ...] = (
    None,
    ("before", "write"),
    ("before", "remove-old"), ("during", "remove-old"),
    ("before", "path->old"),
    ("before", "tmp->path"),
    ("before", "drop-old"), ("during", "drop-old"),
)  # fmt: skip


class Crash(BaseException):  # a kill, not an error: ``except Exception`` does not stop it
    """The process was killed here."""


def _half_delete(p: Path, unlink: Callable) -> None:
    """A removal killed half way: half of a tree's files (a single file: the file) gone."""
    files = sorted(f for f in Path(p).rglob("*") if f.is_file()) if Path(p).is_dir() else [p]
    for f in files[: max(1, len(files) // 2)]:
        unlink(f)


@contextlib.contextmanager
def crash_at(crash: tuple[str, str] | None, root: Path,
             torn_write: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """Kill the next save in directory ``root`` at ``crash``.

    The file system calls themselves are patched (``os.replace``, ``os.rename``,
    ``shutil.rmtree``, ``os.unlink``), for names directly in ``root`` only, so a save that does
    not go through :func:`meshshard.store.atomic.publish` is killed at the same steps.
    ``torn_write()`` is the checkpoint kind's own patch that kills its writer half way
    (``("before", "write")``). Everything is restored on exit."""
    root = Path(root).resolve()
    real = {"replace": os.replace, "rename": os.rename, "rmtree": shutil.rmtree,
            "unlink": os.unlink}
    moved = [False]

    def here(p) -> bool:
        return Path(p).resolve().parent == root

    def renamer(kind):
        def rename(src, dst, *a, **k):
            if here(src) and here(dst):
                step = "tmp->path" if ".tmp" in Path(src).name else "path->old"
                if crash == ("before", step):
                    raise Crash(step)
                real[kind](src, dst, *a, **k)
                moved[0] = moved[0] or step == "tmp->path"
                return None
            return real[kind](src, dst, *a, **k)
        return rename

    def remover(kind):
        def remove(p, *a, **k):
            if here(p) and ".old" in Path(p).name:
                step = "drop-old" if moved[0] else "remove-old"
                if crash == ("before", step):
                    raise Crash(step)
                if crash == ("during", step) and Path(p).exists():
                    _half_delete(Path(p), real["unlink"])
                    raise Crash(step)
            return real[kind](p, *a, **k)
        return remove

    os.replace, os.rename = renamer("replace"), renamer("rename")
    shutil.rmtree, os.unlink = remover("rmtree"), remover("unlink")
    try:
        with torn_write() if crash == ("before", "write") else contextlib.nullcontext():
            yield
    finally:
        os.replace, os.rename = real["replace"], real["rename"]
        shutil.rmtree, os.unlink = real["rmtree"], real["unlink"]


def chain(root: Path, save: Callable[[int], None], load: Callable[[], int],
          torn_write: Callable[[], contextlib.AbstractContextManager], first, second) -> list[int]:
    """save(1); save(2) killed at ``first``; load; save(3) killed at ``second``; load;
    save(4); load. Returns the step each load found, and checks each is the last good one."""
    found = []
    save(1)
    good = 1
    for step, crash in ((2, first), (3, second)):
        try:
            with crash_at(crash, root, torn_write):
                save(step)
        except Crash as killed:  # the new version is in place only once tmp->path ran
            if STEPS.index(killed.args[0]) > STEPS.index("tmp->path"):
                good = step
        else:  # not killed: that step did not occur in this save (e.g. no PATH to move)
            good = step
        found.append(load())
        assert found[-1] == good, (first, second, found)
    save(4)
    found.append(load())
    assert found[-1] == 4
    return found


def leftovers(directory: Path, name: str) -> list[str]:
    """What a finished save left beside ``name``: nothing, once a save has completed."""
    return sorted(p for p in os.listdir(directory) if p != name)
