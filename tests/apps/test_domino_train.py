"""DoMINO training on a synthetic DrivaerML store: 2 ranks (grid in slabs or replicated; ShardTensor
inputs with a plain backward, or local tensors with allreduce_grads) follow the one-process loss
curve and end with the same parameters (float64); the example's ``--model domino`` runs and
prints the comparison."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from meshshard.apps.domino_train import compare_curves
from meshshard.testing.distributed import run_ranks
from tests.apps._domino_fns import train_both

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from meshshard.datasets import make_synthetic_run
    from meshshard.pipelines import preprocess_runs

    root = tmp_path_factory.mktemp("domino")
    make_synthetic_run(root / "raw", index=1, surface_cells=600, volume_cells=0, seed=1)
    preprocess_runs(root / "raw", root / "stores", parts=4, volume=False, stl="mesh",
                    progress=False)  # fmt: skip
    return root / "stores"


@pytest.mark.parametrize(("layout", "form"), [("slab", "shardtensor"), ("slab", "local"),
                                              ("replicated", "shardtensor")])
def test_two_ranks_follow_one_process(store, layout, form):
    a, b = run_ranks(train_both, 2, store / "run_1.zarr", layout, 3, form, timeout=300)
    assert a["losses"] == b["losses"]
    torch.testing.assert_close(torch.tensor(a["losses"]), torch.tensor(a["single"]),
                               rtol=1e-10, atol=0)
    torch.testing.assert_close(*a["params"], rtol=1e-9, atol=1e-12)
    assert a["losses"][-1] < a["losses"][0]


def test_compare_curves_writes_png(tmp_path):
    worst = compare_curves([1.0, 0.5], [1.0, 0.25], tmp_path / "c.png")
    assert worst == pytest.approx(1.0)
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_example_model_domino_one_process(store, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_drivaerml.py"), str(store), "--model",
         "domino", "--steps", "2", "--grid", "6", "4", "4", "--hidden", "8",
         "--compare-single", "--png", str(tmp_path / "loss.png")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "largest relative loss difference" in proc.stdout
    assert (tmp_path / "loss.png").is_file()


def test_a_store_without_the_stl_says_how_to_keep_it(store, tmp_path):
    """A --surface store keeps no STL by default; DoMINO needs its triangles (--stl mesh)."""
    from meshshard.apps.domino_train import domino_sample
    from meshshard.pipelines import preprocess_runs
    from meshshard.store import StoreError

    preprocess_runs(store.parent / "raw", tmp_path, parts=4, volume=False, progress=False)
    with pytest.raises(StoreError, match="has no STL .*--stl mesh"):
        domino_sample(tmp_path / "run_1.zarr", 0, 1, None, grid_shape=(4, 4, 4))
