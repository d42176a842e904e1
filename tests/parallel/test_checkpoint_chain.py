"""The checkpoint fall-back chain: save -> crash -> (fall back to PATH.old) -> save -> crash ->
save. A crash injected at every step of two successive saves always leaves a checkpoint that
loads, and it is the last one whose new version was in place (never an older one, never none).

The crash is a BaseException raised inside :func:`meshshard.store.atomic.publish` (at each of
its renames and deletions) or before the new checkpoint's metadata is written, as a kill at
that instant would stop the save. One process, no process group (rank 0 does the publishing
in a multi-rank save too)."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import meshshard.parallel.checkpoint as ckpt_mod
from meshshard.parallel import load_checkpoint, save_checkpoint
from meshshard.store import atomic


class Crash(BaseException):
    """Stands for the process being killed: nothing catches it."""


#: where a save can be cut: None (it finishes), "write" (shards on disk, no metadata yet), or
#: the n-th rename/deletion publish makes on the checkpoint's names (0, 1, 2, ...)
CUTS = (None, "write", 0, 1, 2, 3)


def _model(step: int):
    m = nn.Linear(3, 2)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(float(step))
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


class _Cutter:
    """Counts publish's operations on ``names`` and raises :class:`Crash` at number ``at``;
    records whether the new version reached ``path`` before the crash."""

    def __init__(self, at, path: Path, names: set[str]):
        self.at, self.path, self.names, self.n, self.placed = at, path, names, 0, False
        self._replace, self._remove = atomic.os.replace, atomic.remove

    def _tick(self, *paths) -> None:
        if not any(Path(p).name in self.names for p in paths):
            return
        if self.n == self.at:
            msg = f"killed at publish step {self.n}"
            raise Crash(msg)
        self.n += 1

    def replace(self, src, dst):
        self._tick(src, dst)
        self._replace(src, dst)
        if Path(dst) == self.path:
            self.placed = True

    def remove(self, p):
        self._tick(p)
        self._remove(p)


def _save(path: Path, step: int, cut, monkeypatch) -> bool:
    """Save checkpoint ``step`` at ``path``, cut at ``cut``; True when the new version is in
    place at ``path`` (the save counts as done, whatever came after)."""
    m, opt = _model(step)
    names = {path.name, path.name + ".tmp", path.name + ".old"}
    cutter = _Cutter(cut, path, names)
    with monkeypatch.context() as mp:
        if cut == "write":
            def killed(*a, **k):
                raise Crash("killed before the metadata")

            mp.setattr(ckpt_mod, "_shapes", killed)
        elif cut is not None:
            mp.setattr(atomic.os, "replace", cutter.replace)
            mp.setattr(atomic, "remove", cutter.remove)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP: "assuming the intent is to save in one process"
            try:
                save_checkpoint(path, m, opt, step=step)
            except Crash:
                return cutter.placed
    return True


def _loaded_step(path: Path) -> int:
    m, opt = _model(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = load_checkpoint(path, m, opt)["step"]
    for p in m.parameters():  # the weights are that step's, not a mix
        assert torch.all(p == float(step)), (step, p)
    return step


@pytest.mark.parametrize(("cut2", "cut3"), list(itertools.product(CUTS, CUTS)))
def test_a_crash_anywhere_in_two_saves_leaves_the_last_good_checkpoint(tmp_path, monkeypatch,
                                                                       cut2, cut3):  # fmt: skip
    path = tmp_path / "ck"
    assert _save(path, 1, None, monkeypatch)
    good = 1
    for step, cut in ((2, cut2), (3, cut3)):
        if _save(path, step, cut, monkeypatch):
            good = step
        assert _loaded_step(path) == good, (step, cut, sorted(p.name for p in tmp_path.iterdir()))
    assert _save(path, 4, None, monkeypatch)  # a clean save after all that
    assert _loaded_step(path) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no debris left
