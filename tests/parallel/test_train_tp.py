"""examples/train_drivaerml.py --tensor-parallel: the same losses as one process."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_drivaerml.py"
ARGS = ["--steps", "2", "--hidden", "8", "--layers", "1", "--slices", "4"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    from meshshard.datasets import make_synthetic_run
    from meshshard.pipelines import preprocess_runs

    root = tmp_path_factory.mktemp("train_tp")
    for i in (1, 2):
        make_synthetic_run(root / "raw", index=i, surface_cells=1500, volume_cells=0, seed=i)
    preprocess_runs(root / "raw", root / "stores", parts=4, volume=False, progress=False)
    return root / "stores"


def _losses(cmd, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return [float(v) for v in re.findall(r"step \d+/\d+ .* loss ([0-9.]+)", r.stderr)], r.stderr


@pytest.mark.slow
def test_example_tensor_parallel_matches_one_process(stores, tmp_path):
    """2 x 1 x 2 (data x domain x tensor) trains with the one-process losses; its distributed
    checkpoint of tensor-parallel weights resumes on 1 x 1 x 2 and continues with them too."""
    one, _ = _losses([sys.executable, str(EXAMPLE), stores, *ARGS, "--steps", "3",
                      "--checkpoint", tmp_path / "a"], tmp_path)
    torchrun = Path(sys.executable).with_name("torchrun")
    tp, err = _losses([str(torchrun), "--standalone", "--nproc-per-node", "4", str(EXAMPLE),
                       stores, *ARGS, "--tensor-parallel", "2", "--data-parallel", "2",
                       "--checkpoint", tmp_path / "b"], tmp_path)
    assert len(one) == 3 and len(tp) == 2, err[-2000:]
    assert tp == pytest.approx(one[:2], rel=1e-4)
    more, err = _losses([str(torchrun), "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
                         stores, *ARGS, "--steps", "3", "--tensor-parallel", "2", "--resume",
                         "--checkpoint", tmp_path / "b"], tmp_path)
    assert "resumed from" in err and more == pytest.approx(one[2:], rel=1e-4), err[-2000:]


def test_example_rejects_tensor_size_that_does_not_divide_the_world(stores, tmp_path):
    r = subprocess.run([sys.executable, str(EXAMPLE), str(stores), *ARGS,
                        "--tensor-parallel", "2"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode != 0
    assert "--data-parallel 1 x --tensor-parallel 2 must divide the world size 1" in r.stderr
