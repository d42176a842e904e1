"""What a new user met from a clean clone (issue 26), one test each: --version, --method help,
a closed pipe, --png paths, an empty directory, too many parts, one-line option errors,
demo --parts 0, the torchrun total, the store report, and options inspect used to ignore."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.cli import EXIT_BROKEN_PIPE, main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from meshshard.datasets import make_synthetic_run
    from meshshard.pipelines import preprocess_runs

    root = tmp_path_factory.mktemp("frictions")
    for i in (1, 2):
        make_synthetic_run(root / "src", i, surface_cells=600, volume_cells=300, seed=i)
    res = preprocess_runs(root / "src", root / "stores", parts=2, volume=False, progress=False)
    assert [r.status for r in res] == ["written", "written"]
    return root


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "usage:" not in err
    return lines[0]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip().startswith("meshshard 0.")


@pytest.mark.parametrize("command", ["partition", "inspect", "preprocess", "demo"])
def test_method_has_help_and_default(command, capsys):
    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "partitioner: hilbert (Hilbert curve" in out and "metis (METIS" in out
    assert "default: hilbert" in out


def test_bad_method_is_one_line(runs, capsys):
    vtp = runs / "src" / "run_1" / "boundary_1.vtp"
    assert main(["partition", str(vtp), "-p", "2", "-o", "x", "--method", "foo"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("meshshard partition: error: argument --method/-m: invalid choice")
    assert "(see meshshard partition --help)" in line


def test_closed_pipe_ends_quietly(runs, capsys, monkeypatch):
    """``inspect --json | head -1``: no 'Broken pipe', exit 141 (as if killed by SIGPIPE)."""
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["inspect", str(runs / "stores" / "run_1.zarr"), "--json"]) == EXIT_BROKEN_PIPE
    monkeypatch.undo()
    assert capsys.readouterr().err == ""
    # and through a real pipe whose reader is gone
    store = runs / "stores" / "run_1.zarr"
    cmd = (f"{sys.executable} -m meshshard inspect {store} --json --no-progress | true; "
           "echo rc=${PIPESTATUS[0]}")  # fmt: skip
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    assert r.stdout.strip() == "rc=141", r.stdout + r.stderr  # the reader left before the write
    assert "Broken pipe" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_png_path_is_checked_and_reported(runs, tmp_path, capsys):
    store = str(runs / "stores" / "run_1.zarr")
    missing = tmp_path / "no" / "such" / "dir" / "x.png"
    assert main(["inspect", store, "--png", str(missing)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"--png {missing}: directory {missing.parent} does not exist" in line
    assert not (tmp_path / "no").exists()  # nothing created
    png = tmp_path / "x.png"
    assert main(["inspect", store, "--png", str(png), "--no-progress"]) == 0
    assert f"wrote {png} (surface shards)" in capsys.readouterr().out
    assert png.stat().st_size > 0


def test_partition_on_an_empty_directory_says_so(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["partition", str(tmp_path / "empty"), "-p", "2", "-o", str(tmp_path / "o")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "empty: is an empty directory, not a mesh or points file" in line
    assert "no such file" not in line


def test_preprocess_too_many_parts_or_no_files_leaves_nothing(runs, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["preprocess", "drivaerml", str(runs / "src"), str(out), "--no-progress"]
    assert main([*argv, "--parts", "100000"]) == 2  # the options' fault: exit 2
    err = capsys.readouterr().err
    assert "fewer than the 100000 parts asked for: every shard needs a cell; use at most" in err
    assert "parts=" not in err
    assert "allow_empty" not in err
    assert not out.exists()  # no empty destination left behind
    (tmp_path / "novtk" / "run_1").mkdir(parents=True)
    out2 = tmp_path / "out2"
    assert main(["preprocess", "drivaerml", str(tmp_path / "novtk"), str(out2), "--parts", "2",
                 "--no-progress", "--surface"]) == 2  # fmt: skip
    assert "missing surface file" in capsys.readouterr().err
    assert not out2.exists()


def test_demo_parts_zero_names_parts(capsys):
    assert main(["demo", "--parts", "0"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--parts 0 must be >= 1" in line and "--ranks" not in line


def test_inspect_refuses_options_it_would_ignore(runs, capsys):
    store = str(runs / "stores" / "run_1.zarr")
    for extra in (["--parts", "3"], ["--method", "rcb"], ["--targets", "0.5,0.5"]):
        assert main(["inspect", store, *extra]) == 2
        line = _one_line(capsys.readouterr().err)
        assert f"is a store, which holds its partition already; {extra[0]}" in line


def test_store_report_reads_like_a_report(runs, capsys):
    assert main(["inspect", str(runs / "stores" / "run_1.zarr"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "mtime_ns" not in out and " UTC" in out and "mtime: 20" in out
    sha = [ln for ln in out.splitlines() if "sha256:" in ln]
    assert sha and all(ln.strip().endswith("...") and len(ln.split()[-1]) == 15 for ln in sha)
    assert "KiB" in out
    assert main(["inspect", str(runs / "stores" / "run_1.zarr"), "--json"]) == 0
    assert "mtime_ns" in capsys.readouterr().out  # machines keep the raw values


def test_torchrun_prints_one_total(runs, tmp_path):
    out = tmp_path / "tr"
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "meshshard", "preprocess", "drivaerml", str(runs / "src"), str(out),
         "--parts", "2", "--surface", "--no-progress"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("meshshard preprocess")]
    assert lines == [f"meshshard preprocess: 2 written, 0 skipped (up to date), 0 failed over "
                     f"2 ranks -> {out}"], r.stdout  # fmt: skip
