"""meshshard.store.atomic: the one "write to a temporary name, then rename" of stores and
checkpoints. The invariant: a complete version is at PATH or PATH.old at every instant."""

from __future__ import annotations

import os

import pytest

from meshshard.store import atomic as _publish
from meshshard.store.atomic import publish, resolve


def _version(path) -> str:
    return (path / "v").read_text()


def _new(tmp, text):
    tmp.mkdir()
    (tmp / "v").write_text(text)
    return tmp


def test_publish_replaces_and_leaves_nothing_behind(tmp_path):
    path, old = tmp_path / "ck", tmp_path / "ck.old"
    publish(_new(tmp_path / "ck.tmp", "1"), path, old)
    publish(_new(tmp_path / "ck.tmp", "2"), path, old)
    assert _version(path) == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_a_leftover_old_survives_until_the_new_version_is_in_place(tmp_path, monkeypatch):
    """The bug of the five copies: after an interrupted save left only PATH.old, the next
    save deleted PATH.old before PATH.tmp became PATH. A crash in that window must not leave
    nothing: here the final rename fails, and PATH.old is still the good version."""
    path, old = tmp_path / "ck", tmp_path / "ck.old"
    _new(old, "1")  # an interrupted save: only PATH.old
    assert resolve(path, old) == old
    real = os.replace

    def crash(src, dst):
        if str(src).endswith(".tmp"):
            msg = "crash between the renames"
            raise OSError(msg)
        return real(src, dst)

    monkeypatch.setattr(_publish.os, "replace", crash)
    with pytest.raises(OSError, match="crash"):
        publish(_new(tmp_path / "ck.tmp", "2"), path, old)
    assert resolve(path, old) == old and _version(old) == "1"
    monkeypatch.setattr(_publish.os, "replace", real)
    publish(tmp_path / "ck.tmp", path, old)  # the rerun finishes the job
    assert _version(path) == "2" and not old.exists()


def test_publish_of_a_file(tmp_path):
    path, old, tmp = tmp_path / "a.json", tmp_path / "a.json.old", tmp_path / "a.json.tmp"
    tmp.write_text("x")
    publish(tmp, path, old)
    tmp.write_text("y")
    publish(tmp, path, old)
    assert path.read_text() == "y" and not old.exists() and not tmp.exists()
