"""Preprocessing processes: crashing runs fail alone, workers die with their parent, SIGINT and
SIGTERM stop everything within seconds with nothing half-written left, live writers are never
taken for stale ones, and an empty or wrong source directory is an error that says why.

Every crash here is a real process dying (SIGSEGV, SIGABRT, SIGKILL), driven by the test hooks
``MESHSHARD_TEST_CRASH_RUN`` and ``MESHSHARD_TEST_HOLD_DIR`` that only worker processes read.
Timeouts are hang guards, never assertions on speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from meshshard.cli import main
from meshshard.datasets import make_synthetic_run
from meshshard.pipelines import preprocess_runs, process_run
from meshshard.pipelines._runlock import RunBusy, run_lock
from meshshard.pipelines.preprocess import CRASH_RUN_ENV, HOLD_ENV

GUARD = 180  # seconds: a hang guard only


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("src3")
    for i in (1, 2, 3):
        make_synthetic_run(root, i, surface_cells=800, volume_cells=600, seed=i)
    return root


def _cmd(src, dst, *extra) -> list[str]:
    return [
        sys.executable, "-m", "meshshard", "preprocess", "drivaerml", str(src), str(dst),
        "--parts", "2", "--no-progress", *extra,
    ]  # fmt: skip


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=os.getcwd(), **extra)


def _run(src, dst, *extra, **env) -> subprocess.CompletedProcess:
    cmd = _cmd(src, dst, *extra)
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(**env), timeout=GUARD)


def _start(src, dst, *extra, hold: Path | None = None, **popen_kw) -> subprocess.Popen:
    """Start the command in the background, its output piped as text (``popen_kw`` overrides
    that). With ``hold`` (a directory made here), each worker waits with its finished
    temporary store until ``hold / "release"`` exists."""
    env = _env()
    if hold is not None:
        hold.mkdir()
        env[HOLD_ENV] = str(hold)
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen_kw}
    return subprocess.Popen(_cmd(src, dst, *extra), env=env, **kw)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for(cond, what: str, timeout: float = GUARD) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"hang guard: still waiting for {what}")
        time.sleep(0.05)


def _held(hold: Path, n: int) -> dict[str, int]:
    """Wait until ``n`` workers hold a finished temporary store; {run: worker pid}."""
    _wait_for(lambda: len(list(hold.glob("*.held"))) >= n, f"{n} held runs in {hold}")
    return {p.name.split(".")[0]: int(p.name.split(".")[1]) for p in hold.glob("*.held")}


def _same_stores(a: Path, b: Path, runs) -> None:
    import zarr

    for run in runs:
        x = zarr.open_group(str(a / f"{run}.zarr"), mode="r")
        y = zarr.open_group(str(b / f"{run}.zarr"), mode="r")
        assert sorted(k for k, _ in x.arrays()) == sorted(k for k, _ in y.arrays())
        assert dict(x.attrs) == dict(y.attrs)
        for k, arr in x.arrays():
            np.testing.assert_array_equal(arr[...], y[k][...], err_msg=f"{run}: {k}")


def _all_three_as_reference(out: Path, reference: Path) -> None:
    """``out`` holds exactly the three run stores, equal to the reference ones."""
    assert sorted(p.name for p in out.iterdir()) == ["run_1.zarr", "run_2.zarr", "run_3.zarr"]
    _same_stores(out, reference, ["run_1", "run_2", "run_3"])


def _rerun_writes_all(three_runs: Path, out: Path, reference: Path, *args: str) -> None:
    """A clean rerun after an interruption writes all three runs, as the reference."""
    again = _run(three_runs, out, *args)
    assert again.returncode == 0, again.stderr
    assert "3 written, 0 skipped (up to date), 0 failed" in again.stdout
    _all_three_as_reference(out, reference)


@pytest.fixture(scope="module")
def reference(three_runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    assert [r.status for r in preprocess_runs(three_runs, out, parts=2, isolate=False)] == [
        "written"
    ] * 3
    return out


@pytest.mark.parametrize(
    ("workers", "how", "died"),
    [(1, "segv", "died from SIGSEGV"), (2, "abort", "died from SIGABRT"), (1, "memory", "")],
)
def test_a_crashing_run_fails_alone(three_runs, reference, tmp_path, workers, how, died):
    out = tmp_path / "out"
    res = _run(three_runs, out, "--workers", str(workers), **{CRASH_RUN_ENV: f"run_2:{how}"})
    assert res.returncode == 1, res.stderr
    assert "2 written, 0 skipped (up to date), 1 failed" in res.stdout
    if how == "memory":  # an exception the worker survives: it names the run
        assert f"run_2: MemoryError: out of memory (while preprocessing {three_runs}" in res.stderr
    else:
        assert "run_2: the worker process (pid " in res.stderr and died in res.stderr
        assert f"while preprocessing {three_runs / 'run_2'}; the other runs went on" in res.stderr
        # the worker logs like its parent (the command's format)
        assert f"ERROR meshshard.pipelines.preprocess: {CRASH_RUN_ENV}=run_2:" in res.stderr
    assert "Traceback" not in res.stderr and "leaked semaphore" not in res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["run_1.zarr", "run_3.zarr"]
    _same_stores(out, reference, ["run_1", "run_3"])


def test_a_real_segfault_inside_vtk_fails_alone(three_runs, tmp_path):
    """VTK 9.7 segfaults on NumberOfPoints="-5" (issue 10); forced through VTK's reader."""
    import shutil

    src = tmp_path / "src"
    for run in ("run_1", "run_2"):
        shutil.copytree(three_runs / run, src / run)
    vtp = src / "run_2" / "boundary_2.vtp"
    data = vtp.read_bytes()
    head = data[:1000].decode("latin-1")
    n = head.split('NumberOfPoints="', 1)[1].split('"', 1)[0]
    vtp.write_bytes(data.replace(f'NumberOfPoints="{n}"'.encode(), b'NumberOfPoints="-5"', 1))
    res = _run(src, tmp_path / "out", "--surface", MESHSHARD_READER="vtk")
    # a crash of VTK is a failed run (1); a clean refusal of the damaged file, the input's (2)
    assert res.returncode == (1 if "died from" in res.stderr else 2), res.stderr
    assert "1 written, 0 skipped (up to date), 1 failed" in res.stdout
    assert "run_2: " in res.stderr and "Traceback" not in res.stderr
    if "died from" in res.stderr:  # the crash seen with VTK 9.7; a later VTK may refuse cleanly
        assert "run_2: the worker process (pid " in res.stderr
        assert "died from SIGSEGV" in res.stderr or "died from SIGABRT" in res.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["run_1.zarr"]


def test_a_worker_killed_from_outside_fails_only_its_run(three_runs, tmp_path):
    """SIGKILL (as the out-of-memory killer sends) to the worker holding run_1."""
    out, hold = tmp_path / "out", tmp_path / "hold"
    proc = _start(three_runs, out, "--workers", "1", hold=hold)
    try:
        pid = _held(hold, 1)["run_1"]
        (hold / "release").write_text("")  # the runs after run_1 go straight through
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=GUARD)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr
    assert "2 written, 0 skipped (up to date), 1 failed" in stdout
    assert f"run_1: the worker process (pid {pid}) died from SIGKILL" in stderr
    assert "out-of-memory killer" in stderr
    assert sorted(p.name for p in out.iterdir()) == ["run_2.zarr", "run_3.zarr"]


@pytest.mark.parametrize(
    ("sig", "workers"),
    [(signal.SIGINT, 2), (signal.SIGTERM, 1)],  # each signal, one and several workers
)
def test_interrupt_stops_everything_and_a_rerun_resumes(
    three_runs, reference, tmp_path, sig, workers
):
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    proc = _start(three_runs, out, "--workers", str(workers), hold=hold, start_new_session=True)
    try:
        pids = _held(hold, workers).values()
        assert any(out.glob("run_*.zarr.tmp-*"))  # a store half-written (not yet published)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C in a terminal reaches the whole process group
        else:
            os.kill(proc.pid, sig)  # `kill PID` reaches the parent only
        stdout, stderr = proc.communicate(timeout=GUARD)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"meshshard preprocess: interrupted by {signal.Signals(sig).name}, stopped"
    )
    assert "Traceback" not in stderr
    _wait_for(lambda: not any(_alive(p) for p in pids), "the workers to be gone", 30)
    assert sorted(p.name for p in out.iterdir()) == []  # nothing half-written, no lock files
    _rerun_writes_all(three_runs, out, reference, "--workers", str(workers))


def test_kill9_of_the_parent_ends_its_workers(three_runs, reference, tmp_path):
    out, hold = tmp_path / "out", tmp_path / "hold"
    proc = _start(three_runs, out, "--workers", "2", hold=hold, stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        pids = list(_held(hold, 2).values())
        assert all(_alive(p) for p in pids)
        proc.kill()  # SIGKILL: no clean-up in the parent
        proc.wait(timeout=GUARD)
        _wait_for(lambda: not any(_alive(p) for p in pids), "the orphaned workers to exit", 30)
    finally:
        for p in pids if "pids" in locals() else []:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    (hold / "release").write_text("")  # had a worker survived, it would now publish its store
    time.sleep(0.5)
    left = sorted(p.name for p in out.iterdir())
    assert not [n for n in left if n.endswith(".zarr")], left  # nothing published after death
    assert any(".zarr.tmp-" in n for n in left)  # the dead workers' temporaries, for a rerun
    _rerun_writes_all(three_runs, out, reference, "--workers", "2")


def test_a_live_writers_temporary_is_never_deleted(three_runs, reference, tmp_path):
    out, hold = tmp_path / "out", tmp_path / "hold"
    first = _start(three_runs, out, "--runs", "run_1", hold=hold)
    try:
        pid = _held(hold, 1)["run_1"]
        tmp = out / f"run_1.zarr.tmp-{pid}"
        assert tmp.is_dir()
        second = _run(three_runs, out)  # e.g. a rerun started while an orphan still writes
        assert second.returncode == 1, second.stderr
        assert "2 written, 0 skipped (up to date), 1 failed" in second.stdout
        assert f"run_1.zarr is being written by another live process (pid {pid} on" in (
            second.stderr
        )
        assert tmp.is_dir() and (tmp / "zarr.json").is_file()  # untouched
        with pytest.raises(RunBusy, match="another live process"):
            process_run(three_runs / "run_1", out, parts=2)
        assert tmp.is_dir()
        (hold / "release").write_text("")
        stdout, stderr = first.communicate(timeout=GUARD)
    finally:
        first.kill()
    assert first.returncode == 0, stderr
    assert "1 written" in stdout
    _all_three_as_reference(out, reference)


def test_run_lock_is_released_when_its_holder_dies(tmp_path):
    code = (
        "import sys, time\n"
        "from meshshard.pipelines._runlock import run_lock\n"
        "with run_lock(sys.argv[1], 'run_7'):\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=_env()
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunBusy, match=rf"run_7\.zarr is being written .*pid {holder.pid} on"):
            with run_lock(tmp_path, "run_7"):
                pass
    finally:
        holder.kill()
        holder.wait(timeout=GUARD)
    with run_lock(tmp_path, "run_7") as locked:  # the kernel dropped the dead holder's lock
        assert locked
    assert list(tmp_path.iterdir()) == []  # the lock file goes with its last holder


def test_an_interrupted_replacement_restores_the_previous_store(runs_src, tmp_path):
    out = tmp_path / "out"
    process_run(runs_src / "run_2", out, parts=2, volume=False)
    os.replace(out / "run_2.zarr", out / "run_2.zarr.old-999999999")  # died between the renames
    res = process_run(runs_src / "run_2", out, parts=2, volume=False)
    assert res.status == "skipped"  # the complete previous store is back, and up to date
    assert sorted(p.name for p in out.iterdir()) == ["run_2.zarr"]


def test_no_runs_is_an_error_that_says_where_it_looked(runs_src, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["preprocess", "drivaerml", str(empty), str(tmp_path / "o"), "--parts", "2"]) == 2
    err = capsys.readouterr().err
    assert "no runs to preprocess: looked for directories named run_<number>" in err
    assert f"directly under {empty.resolve()}; it is empty" in err
    (empty / "notes.txt").write_text("x")
    (empty / "case_1").mkdir()
    assert main(["preprocess", "drivaerml", str(empty), str(tmp_path / "o"), "--parts", "2"]) == 2
    assert "it holds case_1, notes.txt" in capsys.readouterr().err
    # the user passed data/run_1 instead of data/
    argv = ["preprocess", "drivaerml", str(runs_src / "run_1"), str(tmp_path / "o")]
    assert main([*argv, "--parts", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{runs_src / 'run_1'} looks like one run directory" in err
    assert f"meshshard preprocess drivaerml {runs_src} DST --runs run_1" in err
    vtp = runs_src / "run_1" / "boundary_1.vtp"
    assert main(["preprocess", "drivaerml", str(vtp), str(tmp_path / "o"), "--parts", "2"]) == 2
    assert f"{vtp} is a file: pass the directory holding run_<number>/ runs" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "o").exists()


def test_summary_is_rank_labelled_under_torchrun(runs_src, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["preprocess", "drivaerml", str(runs_src), str(tmp_path), "--parts", "2"]
    assert main([*argv, "--surface", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("meshshard preprocess [rank 1/2]: 1 written, 0 skipped")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run_2.zarr"]  # runs 1::2


def test_worker_address_space_is_capped(three_runs, reference, tmp_path):
    """Issue 26, item 4: a run whose reader reserves far more than the worker's budget fails
    alone with a MemoryError naming it (without the cap the 12 GiB reservation succeeds, and
    the run would be written)."""
    from meshshard.pipelines._memcap import MEMORY_ENV

    out = tmp_path / "out"
    res = _run(three_runs, out, **{CRASH_RUN_ENV: "run_2:bigalloc", MEMORY_ENV: "1G"})
    assert res.returncode == 1, res.stderr
    assert "2 written, 0 skipped (up to date), 1 failed" in res.stdout
    assert "run_2: MemoryError: Unable to allocate 12.0 GiB" in res.stderr
    assert "Traceback" not in res.stderr
    _same_stores(out, reference, ["run_1", "run_3"])


def test_worker_memory_setting_is_checked(three_runs, tmp_path):
    from meshshard.pipelines._memcap import MEMORY_ENV, worker_budget

    res = _run(three_runs, tmp_path / "out", **{MEMORY_ENV: "lots"})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{MEMORY_ENV}='lots': expected a size such as 12G" in res.stderr
    os.environ[MEMORY_ENV] = "1.5G"
    try:
        assert worker_budget(4) == int(1.5 * 2**30)
        os.environ[MEMORY_ENV] = "off"
        assert worker_budget(4) is None
    finally:
        del os.environ[MEMORY_ENV]
    assert worker_budget(1) >= 2 << 30


def _workers_of(pid: int) -> list[int]:
    """The spawned worker processes of ``pid`` (not multiprocessing's resource tracker)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmd = (stat.parent / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmd:
            out.append(int(stat.parent.name))
    return out


def test_ctrl_c_while_the_workers_import_prints_one_line_and_no_traceback(three_runs, tmp_path):
    """A terminal's Ctrl-C reaches the workers too; those still importing (before they ignore
    SIGINT) printed a KeyboardInterrupt traceback each. They now start with SIGINT blocked."""
    out = tmp_path / "out"
    proc = _start(three_runs, out, "--workers", "2", start_new_session=True)
    try:
        _wait_for(lambda: len(_workers_of(proc.pid)) >= 2 or proc.poll() is not None,
                  "the workers to start")
        time.sleep(0.3)  # inside their imports (a worker imports for a second or more)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=GUARD)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.strip().splitlines() == ["meshshard preprocess: interrupted by SIGINT, stopped"]
