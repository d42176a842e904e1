"""Fixed costs of a small preprocessing job: a worker process starts without torch (it used to
import ~2,000 modules through ``meshshard.datasets``), and ``--debug`` shows meshshard's lines
rather than every codec numcodecs registers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from meshshard.datasets import make_synthetic_run

ROOT = Path(__file__).resolve().parents[2]


def test_a_preprocessing_worker_never_imports_torch(tmp_path):
    """What a worker runs (the pool's entry point and a whole surface + volume run) in a
    fresh interpreter: torch is not imported. A count of modules, not a timer."""
    code = f"""
import sys
import meshshard.pipelines._workers
from meshshard.pipelines.preprocess import _run_in_worker, RunOptions
from meshshard.datasets.synthetic import make_synthetic_run
make_synthetic_run({str(tmp_path)!r}, 1, surface_cells=300, volume_cells=200, seed=1)
r = _run_in_worker({str(tmp_path / 'run_1')!r}, {str(tmp_path / 'out')!r}, RunOptions(parts=2))
assert r.status == "written", r
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(), timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}


def test_debug_shows_meshshard_lines_not_codec_registrations(tmp_path):
    """The command as a user runs it (pytest's own logging set-up would hide the workers')."""
    make_synthetic_run(tmp_path / "raw", 1, surface_cells=300, volume_cells=0, seed=1)
    out = subprocess.run([sys.executable, "-m", "meshshard", "preprocess", "drivaerml",
                          str(tmp_path / "raw"), str(tmp_path / "out"), "--parts", "2",
                          "--surface", "--debug", "--no-progress"],
                         capture_output=True, text=True, env=_env(), timeout=600)
    assert out.returncode == 0, out.stderr
    assert "DEBUG meshshard.datasets.drivaerml: read" in out.stderr  # the worker's DEBUG ...
    assert "Registering codec" not in out.stderr  # ... without numcodecs' 28 registrations
    assert "Using selector" not in out.stderr
