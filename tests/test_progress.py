"""The stage bar: on a terminal on rank 0 only; every stage timed either way."""

from __future__ import annotations

import io
import sys

from meshshard.commands._progress import Stages, progress_enabled


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_only_on_a_tty_on_rank_0(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not progress_enabled()  # not a terminal (CI logs, pipes)
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert progress_enabled() and not progress_enabled(no_progress=True)
    monkeypatch.setenv("RANK", "1")
    assert not progress_enabled()  # torchrun: rank 0 only
    monkeypatch.setenv("RANK", "0")
    with Stages("meshshard partition", 2, enabled=True) as st:
        with st.stage("read"):
            pass
        with st.stage("graph", "dual, for the metrics"):
            pass
    assert set(st.timings) == {"read", "graph"}
    shown = tty.getvalue()
    assert "meshshard partition: 1/2 stages" in shown and "graph (dual, for the metrics)" in shown


def test_stages_time_without_a_bar(capsys):
    with Stages("x", 1, enabled=False) as st, st.stage("partition"):
        pass
    assert st.timings["partition"] >= 0 and capsys.readouterr().err == ""
