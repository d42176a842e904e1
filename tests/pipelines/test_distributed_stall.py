"""`meshshard preprocess ... --distributed` with a stalled rank ends within MESHSHARD_TIMEOUT
(not torch's 30 minutes), and after SIGTERM, as torchrun sends it, no rank stays alive.

The ranks are real processes started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT in the environment), so ``preprocess_distributed`` makes the process group itself."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from meshshard.datasets import make_synthetic_run
from meshshard.pipelines import preprocess_runs

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 20
# bounds on waiting, not timings: without the fix rank 0 waits 30 minutes (torch's default)
ENDS_WITHIN_S = TIMEOUT_S + 160
SIGTERM_WITHIN_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_ranks(argv: list[str], world: int, stall: str, tmp: Path) -> list[subprocess.Popen]:
    port = _free_port()
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   MESHSHARD_TIMEOUT=str(TIMEOUT_S), MESHSHARD_TEST_STALL=stall,
                   TORCHINDUCTOR_CACHE_DIR=str(tmp / f"inductor{r}"),
                   PYTHONPATH=path)  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "meshshard", *argv], env=env, cwd=tmp,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    return procs


def test_a_stalled_rank_ends_the_job_within_the_timeout(tmp_path):
    make_synthetic_run(tmp_path / "raw", 1, surface_cells=800, volume_cells=0, seed=3)
    res = preprocess_runs(tmp_path / "raw", tmp_path / "stores", parts=2, volume=False,
                          progress=False)  # fmt: skip
    assert [r.status for r in res] == ["written"]
    dst = tmp_path / "out"
    argv = ["preprocess", "drivaerml", str(tmp_path / "stores" / "run_1.zarr"), str(dst),
            "--parts", "2", "--surface", "--distributed", "--no-progress"]  # fmt: skip
    p0, p1 = _start_ranks(argv, 2, "1:write", tmp_path)  # rank 1 stalls while writing
    try:
        try:
            _, err0 = p0.communicate(timeout=ENDS_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"rank 0 still waits {ENDS_WITHIN_S} s after rank 1 stalled, with "
                f"MESHSHARD_TIMEOUT={TIMEOUT_S}"
            ) from None
        assert p0.returncode == 1, err0  # a valid run that failed: exit 1, one line
        lines = [ln for ln in err0.splitlines() if ln.strip()]
        assert lines and lines[-1].startswith("meshshard preprocess: error: "), err0
        assert "Traceback" not in err0, err0
        assert p1.poll() is None  # the stalled rank is still asleep: torchrun now stops it
        p1.send_signal(signal.SIGTERM)
        try:
            _, err1 = p1.communicate(timeout=SIGTERM_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError("rank 1 still alive after SIGTERM") from None
        assert p1.returncode == 128 + signal.SIGTERM, err1
        assert "interrupted by SIGTERM" in err1, err1
    finally:
        for p in (p0, p1):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not (dst / "run_1.zarr").exists()  # nothing published
