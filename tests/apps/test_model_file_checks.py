"""Foreign model checkpoints: every way a model.json or weights file could load silently wrong
(cast dtypes, NaN weights, a zero std, fields outside the output) or hang (a FIFO, a device, a
nested JSON) is one ModelFileError line naming the file and the key, before the model is built.

Each case writes a checkpoint whose hash and size are consistent (a foreign writer, not a
damaged copy: the sha256 check alone cannot catch these)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from meshshard.apps.model_file import ModelFileError, load_model, save_model
from meshshard.models import Transolver

CFG = {"space_dim": 3, "fun_dim": 2, "out_dim": 3, "n_hidden": 8, "n_layers": 1, "heads": 2,
       "slices": 4}
META = {"fields": [["a", 0, 1], ["b", 1, 3]], "scales": {"target_mean": [0, 0, 0],
                                                       "target_std": [1, 1, 1]},
        "inputs": {"part": "surface", "knn": 4}}


@pytest.fixture
def ck(tmp_path):
    torch.manual_seed(0)
    return save_model(tmp_path / "ck", Transolver(**CFG), config=CFG, weights="safetensors",
                      **META)


def _meta(ck) -> dict:
    return json.loads((ck / "model.json").read_text())


def _put_meta(ck, meta) -> None:
    (ck / "model.json").write_text(json.dumps(meta))


def _rewrite_weights(ck, change) -> None:
    """Weights rewritten by ``change(state)``, with model.json's size and sha256 updated to
    match (model.json's tensor list left as it was)."""
    from safetensors.torch import load_file, save_file

    w = ck / "weights.safetensors"
    state = load_file(str(w))
    change(state)
    save_file(state, str(w))
    meta = _meta(ck)
    meta["weights"]["size"] = w.stat().st_size
    meta["weights"]["sha256"] = hashlib.sha256(w.read_bytes()).hexdigest()
    _put_meta(ck, meta)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def _first_float(state) -> str:
    return next(k for k, v in state.items() if v.dtype == torch.float32 and v.numel() > 1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.float16])
def test_weights_of_another_dtype_are_refused(ck, dtype):
    """int32 bits read as float gave NaN predictions; int64/bool/f16 were cast and used."""
    def change(state):
        k = _first_float(state)
        t = state[k]
        state[k] = t.view(torch.int32) if dtype == torch.int32 else t.to(dtype)

    _rewrite_weights(ck, change)
    with pytest.raises(ModelFileError, match=r"is stored as .*, model.json declares float32") \
            as e:
        load_model(ck)
    assert "weights.safetensors" in _one_line(e.value)


def test_declared_dtype_must_be_the_models(ck):
    def change(state):
        state[_first_float(state)] = state[_first_float(state)].view(torch.int32)

    _rewrite_weights(ck, change)
    meta = _meta(ck)
    k = next(k for k, v in meta["tensors"].items() if v[1] == "float32" and len(v[0]) == 2)
    meta["tensors"][k][1] = "int32"  # model.json agrees with the weights; the class does not
    _put_meta(ck, meta)
    with pytest.raises(ModelFileError, match=f"tensor '{k}' is declared int32; a Transolver "
                       "holds float32"):
        load_model(ck)


def test_nan_weights_are_refused(ck):
    def change(state):
        state[_first_float(state)] = torch.full_like(state[_first_float(state)], float("nan"))

    _rewrite_weights(ck, change)
    with pytest.raises(ModelFileError, match=r"has \d+ NaN/inf value\(s\)") as e:
        load_model(ck)
    assert "weights.safetensors" in _one_line(e.value)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("target_std", [1, float("nan"), 1], "'scales.target_std' must be a list of finite numbers"),
    ("target_std", [1, 0, 1], r"'scales.target_std' must be > 0"),
    ("target_std", [1, 1], "'scales.target_std' has 2 values for 3 output columns"),
    ("target_mean", "zero", "'scales.target_mean' must be a list of finite numbers"),
    ("rho", 1e308, r"'scales.rho' = 1e\+308 must be a finite number in \[1e-06, 1e\+06\]"),
])
def test_bad_scales_are_refused(ck, key, value, match):
    meta = _meta(ck)
    meta["scales"][key] = value
    _put_meta(ck, meta)
    with pytest.raises(ModelFileError, match=match) as e:
        load_model(ck)
    assert "model.json" in _one_line(e.value)


@pytest.mark.parametrize(("fields", "match"), [
    ([["a", 0, 1], ["b", 3, 5]], r"'b' has columns \[3, 5\); want 0 <= start < stop <= 3"),
    ([["p", 0, 1], ["tau", 0, 3]], r"overlap at column 0"),
    ([], "'fields' is empty"),
    ([["a", "0", 1]], r"'fields'\[0\] = .* must be \[name, start, stop\]"),
    ([["a", 0, 1], ["a", 1, 3]], "names a field twice"),
])
def test_fields_must_fit_the_output(ck, fields, match):
    """Out-of-range columns were written as 5-column arrays, overlapping ones took shear
    from pressure columns, an empty list wrote nothing: all with exit 0."""
    meta = _meta(ck)
    meta["fields"] = fields
    _put_meta(ck, meta)
    with pytest.raises(ModelFileError, match=match) as e:
        load_model(ck)
    assert "model.json" in _one_line(e.value)


def test_ill_typed_knn_is_named(ck):
    meta = _meta(ck)
    meta["inputs"]["knn"] = "eight"
    _put_meta(ck, meta)
    with pytest.raises(ModelFileError, match=r"'inputs.knn' = 'eight' must be an int >= 1"):
        load_model(ck)


def test_huge_declared_model_fails_before_allocating(ck):
    """A small directory whose config declares a ~1 TB model: refused from the meta-device
    build (allocating it first took 6.3 GB and 79 s at a smaller size)."""
    meta = _meta(ck)
    meta["config"]["n_hidden"] = 200_000
    _put_meta(ck, meta)
    with pytest.raises(ModelFileError, match="weights are not those of a Transolver"):
        load_model(ck)
    # the declared tensors agree with the huge config: refused from the weights' size
    with torch.device("meta"):
        huge = Transolver(**meta["config"]).state_dict()
    meta["tensors"] = {k: [list(v.shape), "float32"] for k, v in huge.items()}
    _put_meta(ck, meta)
    with pytest.raises(ModelFileError, match=r"the config describes [\d,]+ bytes of weights, "
                       r"the weights file has [\d,]+"):
        load_model(ck)


def test_nested_json_is_refused(ck):
    (ck / "model.json").write_text("[" * 100_000 + "]" * 100_000)  # RecursionError before
    with pytest.raises(ModelFileError, match="nested deeper than 32 levels"):
        load_model(ck)
    (ck / "model.json").write_text('{"format": ' + "[" * 40 + "]" * 40 + "}")
    with pytest.raises(ModelFileError, match="nested deeper"):
        load_model(ck)


def test_symlinks_out_of_the_directory_are_refused(ck, tmp_path):
    outside = tmp_path / "elsewhere.json"
    os.replace(ck / "model.json", outside)
    (ck / "model.json").symlink_to(outside)
    with pytest.raises(ModelFileError, match="outside the checkpoint"):
        load_model(ck)
    (ck / "model.json").unlink()
    (ck / "model.json").symlink_to("/dev/zero")  # read with no size limit before
    with pytest.raises(ModelFileError, match="outside the checkpoint"):
        load_model(ck)
    os.replace(outside, ck / "model.json")
    w = ck / "weights.safetensors"
    os.replace(w, tmp_path / "w")
    w.symlink_to(tmp_path / "w")
    with pytest.raises(ModelFileError, match="weights.safetensors: is a symlink to .*outside"):
        load_model(ck)


_FIFO_SCRIPT = """
import sys
from meshshard.apps.model_file import ModelFileError, load_model
for path in sys.argv[1:]:
    try:
        load_model(path)
    except ModelFileError as exc:
        print("refused:", exc, flush=True)
"""


def test_fifo_and_device_are_refused_in_bounded_time(ck, tmp_path):
    """A FIFO in place of model.json or the weights blocked the reader forever, and
    model.json -> /dev/zero was read with no limit: all in one subprocess with a timeout."""
    import shutil

    dirs = []
    for name in ("model.json", "weights.safetensors"):
        d = tmp_path / name.replace(".", "_")
        shutil.copytree(ck, d)
        (d / name).unlink()
        os.mkfifo(d / name)
        dirs.append(d)
    d = tmp_path / "zero"
    shutil.copytree(ck, d)
    (d / "model.json").unlink()
    (d / "model.json").symlink_to("/dev/zero")
    r = subprocess.run([sys.executable, "-c", _FIFO_SCRIPT, *map(str, dirs), str(d)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-400:]
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    for line, name in zip(lines, ("model.json", "weights.safetensors")):
        assert line.startswith("refused:") and "not a regular file" in line, line
        assert f"/{name}:" in line
    assert lines[2].startswith("refused:") and "outside the checkpoint" in lines[2]


def test_missing_standardisation_is_named_for_inference(ck):
    from meshshard.apps.input_checks import check_model_for_inference

    meta = _meta(ck)
    del meta["scales"]["target_mean"], meta["scales"]["target_std"]
    _put_meta(ck, meta)
    mf = load_model(ck)  # a model file without it is fine for other uses
    with pytest.raises(ModelFileError, match="'scales.target_mean' missing from model.json"):
        check_model_for_inference(mf)
    meta["scales"]["dataset"] = {"pMeanTrim": "one"}
    _put_meta(ck, meta)
    with pytest.raises(ModelFileError, match=r"'scales.dataset.pMeanTrim' = 'one' must be"):
        load_model(ck)


def test_oversized_model_json_is_refused_unread(ck):
    with open(ck / "model.json", "r+b") as fh:  # sparse: 17 MiB declared, nothing written
        fh.truncate(17 << 20)
    with pytest.raises(ModelFileError, match=r"model.json: 17825792 bytes, more than the "
                       r"16777216 a model.json may have"):
        load_model(ck)
