"""benchmarks/gpu_check.py runs on the CPU too (the smoke run of the script a lent GPU will
run), prints time, host syncs and peak memory per path, and imports none of the packages the
GPU image lacks (pymetis, zarr, pyvista)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
RUN = """
import runpy, sys
sys.argv = [{script!r}, *{args!r}]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("pymetis", "zarr", "pyvista", "vtk") if m in sys.modules)
print("HEAVY", heavy, "CODE", code)
"""


def _run(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    code = RUN.format(script=str(SCRIPT), args=list(args))
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def test_cpu_smoke_run_prints_every_column(tmp_path):
    out = tmp_path / "rows.json"
    proc = _run(tmp_path, "--device", "cpu", "--size", "tiny", "--json", str(out), "--paths",
                "gather fwd+bwd", "meshgraphnet step (plug)", "attention (SDPA)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HEAVY [] CODE 0" in proc.stdout, proc.stdout[-3000:]
    assert "ms/call" in proc.stdout and "syncs" in proc.stdout and "peak MiB" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["path"] for r in rows] == ["gather fwd+bwd", "meshgraphnet step (plug)",
                                         "attention (SDPA)"]
    for r in rows:
        assert "error" not in r, r
        assert r["ms"] > 0 and r["peak_mib"] > 0 and r["on_device"] == "ok", r
    assert rows[1]["host_syncs"] == 0, rows[1]  # the plug's step reads nothing back


def test_unknown_path_is_refused(tmp_path):
    proc = _run(tmp_path, "--device", "cpu", "--paths", "warp drive")
    assert "unknown paths ['warp drive']" in proc.stderr and "CODE 2" in proc.stdout


@pytest.mark.gpu
def test_gpu_run_keeps_every_path_on_the_device(tmp_path):
    out = tmp_path / "rows.json"
    proc = _run(tmp_path, "--device", "cuda", "--json", str(out))
    assert proc.returncode == 0 and "CODE 0" in proc.stdout, proc.stdout[-4000:]
    for r in json.loads(out.read_text())["rows"]:
        assert r["on_device"] == "ok", r
