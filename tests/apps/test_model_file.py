"""Model checkpoints: round trip (safetensors and weights_only torch files), and one clear
line for a checkpoint of another class, a truncated or corrupt weights file, foreign metadata,
and a run that lacks a field the model predicts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from meshshard.apps.model_file import ModelFileError, load_model, save_model
from meshshard.cli import main
from meshshard.models import MeshGraphNet, Transolver

CFG = {"space_dim": 3, "fun_dim": 2, "out_dim": 3, "n_hidden": 8, "n_layers": 1, "heads": 2,
       "slices": 4}
META = {"fields": [["a", 0, 1], ["b", 1, 3]], "scales": {"target_mean": [0, 0, 0],
                                                       "target_std": [1, 1, 1]},
        "inputs": {"part": "surface", "knn": 4}}


@pytest.mark.parametrize("weights", ["safetensors", "torch"])
def test_round_trip(tmp_path, weights):
    torch.manual_seed(0)
    m = Transolver(**CFG)
    p = save_model(tmp_path / "ck", m, config=CFG, weights=weights, **META)
    assert not list(tmp_path.glob("ck.tmp-*"))
    mf = load_model(p)
    assert mf.class_name == "Transolver" and mf.config == CFG
    assert mf.field_columns() == {"a": (0, 1), "b": (1, 3)}
    x = torch.randn(1, 20, 3), torch.randn(1, 20, 2)
    with torch.no_grad():
        assert torch.equal(mf.model(*x), m.eval()(*x))
    meta = json.loads((p / "model.json").read_text())
    assert meta["weights"]["kind"] == weights
    if weights == "torch":  # a plain state dict: loads with weights_only=True
        assert isinstance(torch.load(p / "weights.pt", weights_only=True), dict)


@pytest.fixture
def ck(tmp_path):
    torch.manual_seed(0)
    return save_model(tmp_path / "ck", Transolver(**CFG), config=CFG, **META)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def test_other_class(ck, tmp_path):
    with pytest.raises(ModelFileError) as e:
        load_model(ck, expect_class="MeshGraphNet")
    assert "holds a Transolver, but this needs one of ['MeshGraphNet']" in _one_line(e.value)
    # model.json claims a class whose tensors the weights do not have
    meta = json.loads((ck / "model.json").read_text())
    meta["config"]["n_hidden"] = 16
    (ck / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ModelFileError, match="weights are not those of a Transolver") as e:
        load_model(ck)
    _one_line(e.value)
    meta["class"] = "Nope"
    (ck / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ModelFileError, match="model class 'Nope' is unknown"):
        load_model(ck)


def test_truncated_and_corrupt_weights(ck):
    w = ck / "weights.safetensors"
    data = w.read_bytes()
    w.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="truncated or replaced weights file") as e:
        load_model(ck)
    assert str(w) in _one_line(e.value)
    w.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ModelFileError, match="corrupt"):
        load_model(ck)


def test_not_a_checkpoint(tmp_path, ck):
    with pytest.raises(FileNotFoundError, match="no model checkpoint there"):
        load_model(tmp_path / "nothing")
    (ck / "model.json").write_text('{"format": "other"}')
    with pytest.raises(ModelFileError, match="not a meshshard model checkpoint"):
        load_model(ck)
    (ck / "model.json").unlink()
    with pytest.raises(ModelFileError, match="no model.json"):
        load_model(ck)


def test_cli_errors_are_one_line(trained, tmp_path, capsys):
    ck = tmp_path / "ck"
    shutil.copytree(trained["ckpt"], ck)
    w = next(ck.glob("weights.*"))
    w.write_bytes(w.read_bytes()[:100])
    rc = main(["predict", str(ck), str(trained["raw"] / "run_1"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith("meshshard predict: error: ") and "truncated" in err
    # a run lacking a field the model predicts
    import pyvista as pv

    run = tmp_path / "run_1"
    shutil.copytree(trained["raw"] / "run_1", run)
    m = pv.read(run / "boundary_1.vtp")
    del m.cell_data["wallShearStressMeanTrim"]
    m.save(run / "boundary_1.vtp")
    rc = main(["evaluate", str(run), "--checkpoint", str(trained["ckpt"]), "--out",
               str(tmp_path / "e")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "has no field 'wallShearStressMeanTrim'" in err
    rc = main(["predict", str(trained["ckpt"]), str(run), "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "has no field 'wallShearStressMeanTrim'" in err
    # another model class
    torch.manual_seed(0)
    other = tmp_path / "mgn"
    mgn_cfg = {"node_in": 3, "edge_in": 4, "out": 1, "hidden": 8}
    save_model(other, MeshGraphNet(**mgn_cfg), config=mgn_cfg, **META)
    rc = main(["predict", str(other), str(trained["raw"] / "run_1"), "--out",
               str(tmp_path / "q")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "holds a MeshGraphNet, but this needs one of ['Transolver']" in err
