"""Distributed checkpoints: 2 x 2 (data x domain) -> 1 x 2 continues with the losses of an
uninterrupted run and of one process; interrupted saves keep the last good checkpoint; a
checkpoint of another model is refused on every rank."""

import json

import pytest
import torch

from meshshard.testing import RankError, run_ranks
from tests.parallel import _ckpt_fns, _fns

SAVE_AT, STEPS = 2, 4


@pytest.mark.parametrize(("save_mode", "load_mode"), [("fsdp", "fsdp"), ("ddp", "fsdp")])
def test_round_trip_across_mesh_shapes(tmp_path, save_mode, load_mode):
    path = tmp_path / "ck"
    uninterrupted = run_ranks(_ckpt_fns.train_save_continue, 4, path, save_mode, SAVE_AT, STEPS,
                              timeout=120)
    assert json.loads((path / "meshshard.json").read_text())["step"] == SAVE_AT
    assert not list(tmp_path.glob("ck.*"))  # no .tmp / .old left behind
    resumed = run_ranks(_ckpt_fns.resume, 2, path, load_mode, STEPS, timeout=120)
    single = _fns.reference(STEPS)[3]
    for rep in resumed:
        assert rep["step"] == SAVE_AT and rep["extra"] == {"note": "2x2"}
        assert rep["losses"] == pytest.approx(uninterrupted[0][SAVE_AT:], rel=1e-6)
        assert rep["losses"] == pytest.approx(single[SAVE_AT:], rel=1e-5)


def test_interrupted_save_keeps_last_good_checkpoint(tmp_path):
    reports = run_ranks(_ckpt_fns.interrupted_save, 2, tmp_path / "ck", timeout=120)
    for rep in reports:  # the failure on rank 1 is reported on every rank
        assert "failed on rank(s) [1]" in rep["error"] and "No space left" in rep["error"]
        assert "previous checkpoint (if any) is unchanged" in rep["error"]
        assert rep["step"] == 1 and rep["same"]
        assert rep["step_old"] == 1 and rep["same_old"]


def test_other_model_or_foreign_directory_errors_on_every_rank(tmp_path):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "meshshard.json").write_text('{"format": "something else"}')
    reports = run_ranks(_ckpt_fns.load_bad, 2, tmp_path, 8, timeout=120)
    for other, foreign, missing in reports:
        assert other.startswith("CheckpointError:") and "from a different model" in other
        assert "checkpoint [16], model [8]" in other
        assert foreign.startswith("CheckpointError:") and "not a meshshard checkpoint" in foreign
        assert missing.startswith("FileNotFoundError:") and "no checkpoint there" in missing


def test_rank_killed_during_save_keeps_last_good_checkpoint(tmp_path):
    path = tmp_path / "ck"
    with pytest.raises(RankError) as info:
        run_ranks(_ckpt_fns.killed_during_save, 2, path, timeout=120, collective_timeout=10)
    assert info.value.status[1] == "died"
    assert json.loads((path / "meshshard.json").read_text())["step"] == 1
    good = torch.load(f"{path}-weights-0.pt")
    for step, weights in run_ranks(_ckpt_fns.load_step_and_weights, 2, path, timeout=120):
        assert step == 1
        for name, w in good.items():
            assert torch.equal(weights[name], w), name
