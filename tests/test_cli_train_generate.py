"""``meshshard generate`` writes runs that preprocess reads; ``meshshard train`` trains on the
stores and writes the model checkpoint predict reads; both refuse bad options in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _one_line(err: str, *needles: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert ": error: " in lines[0] and "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    assert main(["generate", str(root / "raw"), "--runs", "2", "--cells", "800"]) == 0
    return root


def test_generate_writes_runs_preprocess_reads(generated, tmp_path, capsys):
    raw = generated / "raw"
    assert sorted(p.name for p in raw.iterdir()) == ["run_1", "run_2"]
    for i in (1, 2):
        assert (raw / f"run_{i}" / f"boundary_{i}.vtp").is_file()
        assert (raw / f"run_{i}" / f"geo_parameters_{i}.csv").is_file()  # its car's shape
        assert not (raw / f"run_{i}" / f"volume_{i}.vtu").exists()  # --volume-cells 0
    stl = [(raw / f"run_{i}" / f"drivaer_{i}.stl").read_bytes() for i in (1, 2)]
    assert stl[0] != stl[1]  # two different cars
    assert main(["generate", str(tmp_path / "same"), "--runs", "2", "--cells", "800",
                 "--same-car"]) == 0
    same = [(tmp_path / "same" / f"run_{i}" / f"drivaer_{i}.stl").read_bytes() for i in (1, 2)]
    assert same[0] == same[1]  # --same-car: the baseline car every time
    assert main(["preprocess", "drivaerml", str(raw), str(tmp_path / "s"), "--parts", "2",
                 "--surface", "--no-progress"]) == 0
    assert "2 written" in capsys.readouterr().out
    # the same seed writes the same runs; runs already there are refused unless --overwrite
    again = tmp_path / "again"
    assert main(["generate", str(again), "--runs", "1", "--cells", "800"]) == 0
    capsys.readouterr()
    a = (raw / "run_1" / "boundary_1.vtp").read_bytes()
    assert (again / "run_1" / "boundary_1.vtp").read_bytes() == a
    assert main(["generate", str(again), "--runs", "1", "--cells", "800"]) == 2
    _one_line(capsys.readouterr().err, "run_1", "exist already", "--overwrite")
    assert main(["generate", str(again), "--runs", "1", "--cells", "800", "--overwrite"]) == 0


@pytest.mark.parametrize(("flags", "said"), [
    (("--runs", "0"), "--runs 0 must be >= 1"),
    (("--cells", "5"), "--cells 5 must be >= 100"),
    (("--volume-cells", "-1"), "--volume-cells -1 must be >= 0"),
])
def test_generate_refuses_bad_numbers(tmp_path, capsys, flags, said):
    assert main(["generate", str(tmp_path / "raw"), *flags]) == 2
    _one_line(capsys.readouterr().err, said)
    assert not (tmp_path / "raw").exists()


@pytest.fixture(scope="module")
def stores(generated):
    from meshshard.pipelines import preprocess_runs

    preprocess_runs(generated / "raw", generated / "stores", parts=2, volume=False,
                    progress=False)
    return generated / "stores"


def test_train_command_writes_a_model_predict_reads(stores, generated, tmp_path):
    """As a user runs it: a fresh ``python -m meshshard train`` process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))
    env.pop("RANK", None)
    ck = tmp_path / "ck"
    r = subprocess.run([sys.executable, "-m", "meshshard", "train", str(stores), "--steps", "2",
                        "--hidden", "8", "--layers", "1", "--slices", "4", "--checkpoint",
                        str(ck)], capture_output=True, text=True, timeout=600, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 2/2" in r.stderr and "validation (1 runs" in r.stderr, r.stderr
    assert (ck / "meshshard.json").is_file() and (tmp_path / "ck-model" / "model.json").is_file()
    from meshshard.apps.model_file import load_model

    mf = load_model(tmp_path / "ck-model", expect_class="Transolver")
    assert mf.config["n_hidden"] == 8
    assert main(["predict", str(tmp_path / "ck-model"), str(generated / "raw" / "run_1"),
                 "--out", str(tmp_path / "pred"), "--no-png"]) == 0


@pytest.mark.parametrize(("flags", "said"), [
    (("--steps", "0"), "--steps 0 must be >= 1"),
    (("--val-fraction", "1"), "--val-fraction 1.0 must be >= 0 and < 1"),
    (("--lr", "-1"), "--lr -1.0 must be > 0"),
])
def test_train_refuses_bad_options_before_any_group(stores, capsys, flags, said):
    import torch.distributed as dist

    before = dist.is_initialized()  # (an earlier in-process predict may have made a world)
    assert main(["train", str(stores), *flags]) == 2
    _one_line(capsys.readouterr().err, "meshshard train: error: ", said)
    assert dist.is_initialized() == before


def test_train_without_stores_says_how_to_make_them(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope")]) == 2
    _one_line(capsys.readouterr().err, "nope: no such directory", "meshshard preprocess")
    (tmp_path / "empty").mkdir()
    assert main(["train", str(tmp_path / "empty")]) == 2
    _one_line(capsys.readouterr().err, "no run_<i>.zarr stores", "meshshard preprocess")
