import pytest

from meshshard.testing import RankError, run_ranks
from tests.testing import _fns


@pytest.mark.parametrize("world_size", [2, 4])
def test_allreduce_real_ranks(world_size):
    out = run_ranks(_fns.allreduce_rank, world_size)
    expected = world_size * (world_size + 1) / 2
    assert out == [expected] * world_size


def test_backend_is_gloo_unless_named():
    """The CPU suite must test gloo on a host with GPUs too: no silent switch to NCCL."""
    assert run_ranks(_fns.backend_name, 2) == ["gloo", "gloo"]


def test_args_and_rank_order():
    out = run_ranks(_fns.echo_args, 2, 7, "x")
    assert out == [(0, 2, 7, "x"), (1, 2, 7, "x")]


def test_uneven_all_to_all_on_gloo():
    out = run_ranks(_fns.uneven_all_to_all, 2)
    # rank 0 receives 1 value from rank 0 (tag 0) and 2 values from rank 1 (tag 10)
    assert out[0] == [0.0, 10.0, 10.0]
    assert out[1] == [1.0, 1.0, 11.0, 11.0, 11.0]


def test_failure_reports_traceback_and_does_not_hang():
    with pytest.raises(RankError) as info:
        run_ranks(_fns.fail_on_rank_one, 2, timeout=600)
    assert "deliberate failure on rank 1" in info.value.failures[1]
    assert "rank 1" in str(info.value)
    # rank 0 was blocked in a collective: it fails (peer gone) or is stopped once rank 1
    # failed; it is not left waiting for the 600 s timeout
    assert "timed out" not in info.value.failures[0]


def test_hung_rank_times_out():
    with pytest.raises(RankError, match="timed out") as info:
        run_ranks(_fns.hang, 2, timeout=8)
    err = info.value
    assert err.status == {0: "running", 1: "running"}
    assert err.stuck == []  # nobody waited in a collective: all hung, none "never arrived"
    for text in err.failures.values():  # each rank's stack when it was stopped
        assert "most recent call first" in text and " in hang" in text


def test_stalled_rank_is_named_as_never_arrived():
    """Rank 1 sleeps before a collective on the group [0, 1]; rank 0 waits there; rank 2 is
    not in the group and finishes. MESHSHARD_TIMEOUT (from ``env``) reaches the sub-group."""
    with pytest.raises(RankError) as info:
        run_ranks(_fns.stall_rank_one, 3, timeout=300, env={"MESHSHARD_TIMEOUT": "4"})
    err = info.value
    assert err.status == {0: "raised", 1: "running", 2: "finished"}
    assert err.stuck == [1]
    assert "rank(s) [1] never arrived" in str(err)
    assert "NEVER ARRIVED" in err.failures[1] and " in stall_rank_one" in err.failures[1]
    # the waiting rank's own error is reported, with the timeout it was given
    assert "Timed out waiting 4000ms" in err.failures[0]
    assert "rank 2: finished" in str(err)


def test_rank_that_dies_is_reported():
    with pytest.raises(RankError, match="exited with code 3"):
        run_ranks(_fns.hard_exit, 2, timeout=60)


def test_world_size_must_be_positive():
    with pytest.raises(ValueError, match="world_size=0"):
        run_ranks(_fns.allreduce_rank, 0)


def test_semaphores_made_by_ranks_are_not_reported_leaked(tmp_path):
    """Ranks leave by os._exit; their multiprocessing finalizers still run, so the resource
    tracker has nothing to warn about when the parent exits."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(
        "from meshshard.testing import run_ranks\n"
        "from tests.testing import _fns\n"
        "if __name__ == '__main__':\n"
        "    print(run_ranks(_fns.make_named_semaphore, 2, timeout=120))\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=root, timeout=300,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "[0, 1]" in proc.stdout
    assert "leaked semaphore" not in proc.stderr, proc.stderr


def test_ctrl_c_prints_no_rank_or_forkserver_traceback(tmp_path):
    """Ctrl-C goes to the whole process group: only the parent (which stops the ranks) reacts;
    the forkserver and the ranks start with SIGINT ignored and print nothing."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(
        "import signal, sys\n"
        "from meshshard.testing import run_ranks\n"
        "from tests.testing import _fns\n"
        "if __name__ == '__main__':\n"
        # as at a terminal: a shell's background job (`cmd &` without job control, e.g. a CI
        # script) starts with SIGINT ignored, and Python keeps an inherited SIG_IGN
        "    signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "    try:\n"
        f"        run_ranks(_fns.touch_then_sleep, 2, {str(tmp_path)!r}, timeout=200)\n"
        "    except KeyboardInterrupt:\n"
        "        print('parent stopped', file=sys.stderr)\n"
        "        sys.exit(130)\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        start_new_session=True,
    )
    def forkserver_started() -> bool:
        for pid in os.listdir("/proc"):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"forkserver" in cmd and str(script).encode() not in cmd and (
                os.getpgid(int(pid)) == proc.pid
            ):
                return True
        return False

    try:
        # first Ctrl-C while the forkserver imports torch (its preload), a second once the
        # ranks run; what a terminal's Ctrl-C does is a SIGINT to the whole group
        for _ in range(1200):  # hang guards only
            if forkserver_started():
                break
            time.sleep(0.01)
        time.sleep(0.3)  # past the interpreter's start-up, inside `import torch`
        os.killpg(proc.pid, signal.SIGINT)
        for _ in range(1200):
            if proc.poll() is not None or all(
                (tmp_path / f"rank{r}").exists() for r in range(2)
            ):
                break
            time.sleep(0.1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "parent stopped" in err
    assert "KeyboardInterrupt" not in err, err
    assert "Traceback" not in err, err


def test_ctrl_c_while_ranks_start_is_kept_not_dropped():
    """A Ctrl-C that arrives while run_ranks starts its processes (SIGINT blocked, so the
    forkserver and ranks never see it) is raised in the parent when the start ends; it used to
    be ignored, and the run then went on until its timeout."""
    import os
    import signal

    import pytest

    from meshshard.comm.signals import sigint_deferred

    reached = []
    # as at a terminal (a CI job may inherit SIGINT ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigint_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                reached.append("still starting")  # not interrupted inside the window
        assert reached == ["still starting"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.signal(signal.SIGINT, before)
