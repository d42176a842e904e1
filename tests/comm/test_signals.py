"""SIGINT and SIGTERM end a rank blocked in a collective within seconds, not at the collective
timeout (300 s here); the job (torchrun) then ends. The bound asserted (60 s from the signal)
is far below the timeout and far above a loaded machine's start-up noise."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshshard.comm.process import TIMEOUT_ENV

ROOT = Path(__file__).resolve().parents[2]
LONG = 300


@pytest.mark.parametrize(("mode", "sig"), [("cli", signal.SIGTERM), ("plain", signal.SIGINT)])
def test_a_signal_ends_a_rank_blocked_in_a_collective_and_the_job(tmp_path, mode, sig):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **{TIMEOUT_ENV: str(LONG)})
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "tests" / "comm" / "_blocked_rank.py"), mode, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
        start_new_session=True,
    )
    try:
        pid_file = tmp_path / "rank0.pid"
        deadline = time.monotonic() + 240
        while not pid_file.exists() or not pid_file.read_text():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
            time.sleep(0.2)
        time.sleep(2.0)  # rank 0 is inside the all-reduce by now
        os.kill(int(pid_file.read_text()), sig)
        sent = time.monotonic()
        out, _ = job.communicate(timeout=LONG + 60)
        took = time.monotonic() - sent
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert took < 60, (took, out)  # seconds, not the 300 s collective timeout
    assert job.returncode != 0, out
    assert "the all-reduce returned" not in out, out
    name = signal.Signals(sig).name
    assert f"meshshard: {name} reached rank 0 while its main thread was blocked" in out, out
    assert f"(exit {128 + sig})" in out, out


_HANDLED = """
import signal, sys, time
from meshshard.comm.signals import end_blocked_on_signal
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))  # a script's own, lenient handler
assert end_blocked_on_signal(grace=0.5)
print("ready", flush=True)
end = time.monotonic() + 3.0
while time.monotonic() < end:  # back in Python all the time: the handler runs at once
    time.sleep(0.01)
print("handled", got, flush=True)
"""


def test_a_signal_whose_handler_runs_is_left_to_the_handler():
    """The watcher ends a process only when the handler could not run; a script that handles
    SIGTERM and goes on (here for 3 s, six times the grace) is not ended."""
    proc = subprocess.Popen([sys.executable, "-c", _HANDLED], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"handled [{int(signal.SIGTERM)}]" in out and "meshshard:" not in err, (out, err)


_FIRST_CHILD = """
import multiprocessing as mp, os, signal, sys
from meshshard.comm.signals import sigint_deferred


def blocked():
    with open(f"/proc/{os.getpid()}/status") as f:
        mask = int(next(l for l in f if l.startswith("SigBlk")).split()[1], 16)
    sys.exit(3 if mask & (1 << (signal.SIGINT - 1)) else 4)


if __name__ == "__main__":
    ctx = mp.get_context("spawn")  # nothing else first: no queue, no lock (they would start
    for _ in range(2):             # the resource tracker before the first child)
        with sigint_deferred():
            p = ctx.Process(target=blocked)
            p.start()
        p.join()
        print(p.exitcode == 3, flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_even_the_first_child_of_a_process_starts_with_sigint_blocked(tmp_path):
    """multiprocessing's resource tracker, started with the first spawned child, unblocks
    SIGINT on its way: the first preprocess worker then printed a KeyboardInterrupt traceback
    when Ctrl-C came while it imported."""
    script = tmp_path / "first_child.py"
    script.write_text(_FIRST_CHILD)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"], r.stdout
