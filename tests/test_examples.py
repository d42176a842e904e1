
"""The README's quickstart runs as written under torchrun (2 gloo ranks)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_under_torchrun():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "examples" / "quickstart.py")],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sizes [6667, 13333]" in r.stdout
    assert "rank 0: 6667 points" in r.stdout and "rank 1: 13333 points" in r.stdout
    assert "weight gradients equal a single-device run" in r.stdout
    # seeded: the loss is the one the README promises
    promised = re.search(r"rank 0 ends with `(loss [0-9.]+)`", (ROOT / "README.md").read_text())
    assert promised and promised.group(1) + ";" in r.stdout, r.stdout


def test_shutdown_with_exit_code_ends_every_rank_there(tmp_path):
    script = tmp_path / "end.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from meshshard.comm.process import shutdown\n"
        "dist.init_process_group('gloo')\n"
        "mesh = init_device_mesh('cpu', (2,))\n"
        "print(f'rank {dist.get_rank()} before', flush=True)\n"
        "shutdown(exit_code=0)\n"
        "print('after')\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0 before" in r.stdout and "rank 1 before" in r.stdout
    assert "after" not in r.stdout




def test_train_meshgraphnet_under_torchrun():
    """Two ranks read their cells and dual-graph shards from a store and follow the loss curve
    of one process on the whole graph."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "examples" / "train_meshgraphnet.py"), "--cells", "2000", "--steps", "4",
         "--hidden", "8", "--layers", "2", "--compare"],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 rank(s), per_layer" in r.stdout
    line = [s for s in r.stdout.splitlines() if s.startswith("max relative difference")]
    assert line and float(line[0].split()[-1]) < 1e-4, r.stdout
