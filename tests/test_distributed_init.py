"""meshshard.comm.process: the collective timeout (argument, MESHSHARD_TIMEOUT, default) and
init() under torchrun, where a stalled rank is shown by its stack."""

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.comm.process import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, collective_timeout

ROOT = Path(__file__).resolve().parents[1]


def test_timeout_argument_then_environment_then_default():
    assert DEFAULT_TIMEOUT_S == 300.0  # minutes, not torch's 30
    assert collective_timeout(environ={}) == dt.timedelta(minutes=5)
    assert collective_timeout(environ={TIMEOUT_ENV: "42"}) == dt.timedelta(seconds=42)
    assert collective_timeout(7, environ={TIMEOUT_ENV: "42"}) == dt.timedelta(seconds=7)
    assert collective_timeout(dt.timedelta(minutes=2)) == dt.timedelta(minutes=2)
    assert collective_timeout(environ={TIMEOUT_ENV: " "}) == dt.timedelta(minutes=5)


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "inf", "nan"])
def test_bad_timeout_in_environment_names_the_variable(raw):
    with pytest.raises(ValueError, match=TIMEOUT_ENV):
        collective_timeout(environ={TIMEOUT_ENV: raw})


def test_bad_timeout_argument():
    with pytest.raises(ValueError, match="timeout=0"):
        collective_timeout(0)


def test_torchrun_stall_ends_with_the_timeout_and_the_stuck_rank_stack(tmp_path):
    """init() under torchrun: MESHSHARD_TIMEOUT=2 reaches a group made after init; rank 0's
    collective fails with it, and rank 1 (stalled) prints its stack when torchrun stops it."""
    script = tmp_path / "stall.py"
    script.write_text(
        "import time\n"
        "import torch\n"
        "import torch.distributed as dist\n"
        "from meshshard.comm.process import init\n"
        "rank, world = init()\n"
        "group = dist.new_group([0, 1])\n"
        "if rank == 1:\n"
        "    time.sleep(300)  # the stall: line 8\n"
        "dist.all_reduce(torch.ones(1), group=group)\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **{TIMEOUT_ENV: "2"})
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "Timed out waiting 2000ms" in out, out
    assert 'stall.py", line 8 in <module>' in out, out  # faulthandler's dump of rank 1


def test_default_backend_serves_cpu_tensors_beside_nccl(monkeypatch):
    """With CUDA the default group is device-mapped (NCCL for CUDA tensors, gloo for the CPU
    tensors a script still moves): plain "nccl" raises on any CPU tensor in a collective."""
    import torch

    from meshshard.comm.process import default_backend, default_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_backend() == "gloo"
    assert default_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_backend() == "cpu:gloo,cuda:nccl"
