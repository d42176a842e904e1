"""The checkpoint fall-back chain for the checkpoints outside meshshard.parallel: a kill at
each step of save -> fall-back -> save leaves a loadable checkpoint, and it is the last good one
(never an older one, never none).

The single-file checkpoints of :mod:`meshshard.apps.train` (the demo) and the model
checkpoints of :mod:`meshshard.apps.model_file` that ``predict`` reads. The kill is injected
at the file system calls themselves (see ``tests/_crash_chain.py``), so a save that bypasses
:func:`meshshard.store.atomic.publish` is caught too (model_file's was, and lost the model).
DCP checkpoints: ``tests/parallel/test_checkpoint_chain.py``; ``--resume`` on the state a kill
between the renames leaves: ``tests/test_train.py``."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import pytest
import torch

from tests._crash_chain import CRASHES, Crash, chain, leftovers

PAIRS = list(itertools.product(CRASHES, CRASHES))


def _model(step: int) -> torch.nn.Module:
    m = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(float(step))  # the weights say which save they are from
    return m


def _step_of(m: torch.nn.Module) -> int:
    values = {float(v) for p in m.parameters() for v in p.detach().flatten()}
    assert len(values) == 1, f"weights of several saves mixed: {values}"
    return int(values.pop())


def _file_kind(path: Path):
    from meshshard.apps import train as tr

    cfg = tr.TrainConfig()

    def save(step):
        m = _model(step)
        tr.save_checkpoint(path, m, torch.optim.SGD(m.parameters(), lr=0.1), step, cfg)

    def load():
        payload = tr.load_checkpoint(path)
        m = _model(0)
        m.load_state_dict(payload["model"])
        assert _step_of(m) == payload["step"]
        return payload["step"]

    @contextlib.contextmanager
    def torn_write():  # killed half way through torch.save
        real = tr.torch.save

        def half(obj, fh, *a, **k):
            fh.write(b"PK\x03\x04 half a checkpoint")
            raise Crash("write")

        tr.torch.save = half
        try:
            yield
        finally:
            tr.torch.save = real

    return save, load, torn_write


def _model_file_kind(path: Path):
    from meshshard.apps import model_file as mf
    from meshshard.models import Transolver

    cfg = {"space_dim": 3, "fun_dim": 1, "out_dim": 2, "n_hidden": 4, "n_layers": 1,
           "heads": 2, "slices": 2}

    def save(step):
        m = Transolver(**cfg)
        with torch.no_grad():
            for q in m.parameters():
                q.fill_(float(step))
        mf.save_model(path, m, config=cfg, fields=[["a", 0, 2]], scales={},
                      inputs={"part": "surface"}, weights="torch", extra={"step": step})

    def load():
        loaded = mf.load_model(path)
        assert _step_of(loaded.model) == loaded.extra["step"]
        return loaded.extra["step"]

    @contextlib.contextmanager
    def torn_write():  # killed half way through writing the weights
        real = mf.torch.save

        def half(obj, f, *a, **k):
            Path(f).write_bytes(b"PK\x03\x04 half a model")
            raise Crash("write")

        mf.torch.save = half
        try:
            yield
        finally:
            mf.torch.save = real

    return save, load, torn_write


@pytest.mark.parametrize("kind", [_file_kind, _model_file_kind], ids=["file", "model-file"])
def test_a_crash_at_every_step_leaves_the_last_good_checkpoint(tmp_path, kind):
    for i, (first, second) in enumerate(PAIRS):
        root = tmp_path / str(i)
        root.mkdir()
        save, load, torn = kind(root / "ck")
        assert len(chain(root, save, load, torn, first, second)) == 3
        # the clean 4th save removed every temporary and PATH.old; only a torn *file*
        # temporary of another pid would stay (none here: the same pid, overwritten)
        assert leftovers(root, "ck") == [], (first, second)


def test_the_chain_notices_a_lost_checkpoint(tmp_path, monkeypatch):
    """The oracle itself: a publish with the old bug (PATH.old dropped before PATH.tmp became
    PATH) loses the checkpoint when killed between the two, and the chain says so."""
    from meshshard.store import atomic

    real = atomic.publish

    def buggy(tmp, path, old):
        if not Path(path).exists():
            atomic.remove(old)  # the bug
        return real(tmp, path, old)

    monkeypatch.setattr(atomic, "publish", buggy)
    monkeypatch.setattr("meshshard.apps.train.publish", buggy)
    save, load, torn = _file_kind(tmp_path / "ck")
    with pytest.raises(FileNotFoundError):
        chain(tmp_path, save, load, torn, ("before", "tmp->path"), ("before", "tmp->path"))
