"""Training helpers: checkpoints, the torchrun example, store/world-size mismatches."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from meshshard.apps.train import TrainConfig, load_checkpoint, make_model, save_checkpoint
from meshshard.testing import RankError, run_ranks

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoint_roundtrip_atomic_and_corrupt(tmp_path):
    cfg = TrainConfig(n_hidden=8, n_layers=1, heads=2, slices=4)
    model = make_model(cfg, 3, 2)
    opt = torch.optim.Adam(model.parameters())
    path = save_checkpoint(tmp_path / "ck.pt", model, opt, 7, cfg, extra={"a": [1.0]})
    assert not list(tmp_path.glob("*.tmp-*"))  # temporary file renamed away
    ck = load_checkpoint(path)
    assert ck["step"] == 7 and ck["extra"] == {"a": [1.0]}
    for k, v in model.state_dict().items():
        assert torch.equal(ck["model"][k], v)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="bad.pt: corrupt or unreadable checkpoint"):
        load_checkpoint(bad)
    assert bad.read_bytes() == b"not a checkpoint"  # nothing overwritten
    torch.save({"something": 1}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a meshshard checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    from meshshard.datasets import make_synthetic_run
    from meshshard.pipelines import preprocess_runs

    root = tmp_path_factory.mktemp("train")
    for i in (1, 2):
        make_synthetic_run(root / "raw", index=i, surface_cells=1500, volume_cells=0, seed=i)
    preprocess_runs(root / "raw", root / "stores", parts=4, volume=False, progress=False)
    return root / "stores"


def _example(*args, cwd):
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_drivaerml.py"), *map(str, args)],
        capture_output=True, text=True, cwd=cwd, timeout=600,
    )


def _step_of(ck):
    import json

    return json.loads((ck / "meshshard.json").read_text())["step"]


def test_example_trains_checkpoints_resumes_and_validates(stores, tmp_path):
    ck = tmp_path / "ck"
    common = ["--hidden", "8", "--layers", "1", "--slices", "4", "--checkpoint", ck]
    r = _example(stores, "--steps", "3", *common, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "step 3/3" in r.stderr and "validation" in r.stderr
    assert f"saved checkpoint {ck} at step 3" in r.stderr
    assert _step_of(ck) == 3
    r = _example(stores, "--steps", "5", "--resume", "--data-parallel-mode", "fsdp", *common,
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stderr and "step 4/5" in r.stderr and "step 1/5" not in r.stderr
    assert "view tensor" not in r.stderr  # FSDP2's warning of silently wrong gradients
    assert _step_of(ck) == 5
    # a crafted DCP .metadata: refused, its payload never runs (issue 26)
    import pickle

    from meshshard.parallel._safe_dcp import read_metadata
    from tests.parallel.test_checkpoint_safety import _Payload

    good = (ck / ".metadata").read_bytes()
    meta = read_metadata(ck / ".metadata")
    meta.planner_data = _Payload(tmp_path / "PWNED")
    (ck / ".metadata").write_bytes(pickle.dumps(meta))
    r = _example(stores, "--steps", "6", "--resume", *common, cwd=tmp_path)
    assert r.returncode == 2 and "refused to load" in r.stderr, r.stderr[-2000:]
    assert "resumed" not in r.stderr and not (tmp_path / "PWNED").exists()
    (ck / ".metadata").write_bytes(good)
    # the model checkpoint written after FSDP2 training loads as a plain Transolver
    from meshshard.apps.model_file import load_model

    mf = load_model(tmp_path / "ck-model", expect_class="Transolver")
    assert mf.config["n_hidden"] == 8 and [f[0] for f in mf.fields][:2] == [
        "pMeanTrim", "wallShearStressMeanTrim"]
    assert len(mf.scales["target_std"]) == mf.config["out_dim"]
    (ck / "meshshard.json").write_bytes(b"garbage")
    r = _example(stores, "--steps", "6", "--resume", *common, cwd=tmp_path)
    assert r.returncode == 2 and "corrupt or unreadable checkpoint" in r.stderr
    assert (ck / "meshshard.json").read_bytes() == b"garbage"
    other = tmp_path / "other"  # a checkpoint of a wider model
    r = _example(stores, "--steps", "1", "--hidden", "16", "--layers", "1", "--slices", "4",
                 "--checkpoint", other, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _example(stores, "--steps", "2", "--resume", *common[:-1], other, cwd=tmp_path)
    assert r.returncode == 2 and "checkpoint is from a different model" in r.stderr



def test_resume_after_a_crash_between_the_renames_continues_from_the_last_good_step(
    stores, tmp_path
):
    """The state a kill between publish's two renames leaves: only PATH.old (the last good
    checkpoint) and a half-written PATH.tmp. --resume continues from PATH.old's step; with no
    checkpoint at all it says so instead of silently starting again at step 1."""
    import shutil

    ck = tmp_path / "ck"
    common = ["--hidden", "8", "--layers", "1", "--slices", "4", "--checkpoint", ck]
    r = _example(stores, "--steps", "2", *common, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _step_of(ck) == 2
    old = ck.with_name("ck.old")
    ck.rename(old)  # the next save moved PATH aside, then was killed
    shutil.copytree(old, ck.with_name("ck.tmp"))
    (ck.with_name("ck.tmp") / "meshshard.json").unlink()  # its new version was half written
    r = _example(stores, "--steps", "4", "--resume", *common, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "loading" in r.stderr and "interrupted save" in r.stderr  # the fall-back is named
    assert "resumed from" in r.stderr and "step 3/4" in r.stderr and "step 1/4" not in r.stderr
    assert _step_of(ck) == 4 and not old.exists() and not ck.with_name("ck.tmp").exists()
    fresh = ["--hidden", "8", "--layers", "1", "--slices", "4", "--checkpoint", tmp_path / "new"]
    r = _example(stores, "--steps", "1", "--resume", *fresh, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--resume: no checkpoint at" in r.stderr and "starting at step 1" in r.stderr

def _load_with_world(rank, world_size, store):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.apps.train import load_sample

    mesh = init_device_mesh("cpu", (world_size,))
    load_sample(store, rank, world_size, mesh, knn=4)


def test_world_size_that_does_not_fit_the_store(stores):
    with pytest.raises(RankError) as info:
        run_ranks(_load_with_world, 3, str(stores / "run_1.zarr"), timeout=60)
    assert len(info.value.failures) == 3
    assert all("world_size must divide nparts" in t for t in info.value.failures.values())


def test_split_runs_holds_out_at_least_one_never_all():
    from meshshard.apps.train import split_runs

    runs = [f"r{i}" for i in range(5)]
    assert split_runs(runs, 0.2)[:2] == (runs[1:], runs[:1])
    assert split_runs(runs, 0.01)[:2] == (runs[1:], runs[:1])  # at least one
    assert split_runs(runs, 0.99)[:2] == (runs[4:], runs[:4])  # never all: one trains
    assert split_runs(runs, 0.0) == (runs, [], None)  # asked for none: nothing to say
    train, val, note = split_runs(runs[:1], 0.2)
    assert train == runs[:1] and val == [] and "no validation set" in note
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="--val-fraction .* must be >= 0 and < 1"):
            split_runs(runs, bad)


def test_example_on_one_run_says_there_is_no_validation_set(stores, tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    (one / "run_1.zarr").symlink_to(stores / "run_1.zarr", target_is_directory=True)
    common = ["--hidden", "8", "--layers", "1", "--slices", "4", "--steps", "1",
              "--checkpoint", tmp_path / "ck"]  # fmt: skip
    r = _example(one, *common, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "WARNING" in r.stderr and "only 1 run: no validation set" in r.stderr
    assert "validation (" not in r.stderr  # no validation line pretending otherwise
    r = _example(one, *common, "--val-fraction", "1.5", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "--val-fraction 1.5 must be >= 0 and < 1" in lines[0]
