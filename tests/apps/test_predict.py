"""``meshshard predict``: a copy of the input VTK with the predicted arrays (pyvista reads it
back with the input's point and cell counts), a PNG and a JSON; the same predictions from
1 process and from 2 ranks (run directory and curator store); on 3 ranks over a 2-part store
(repartitioned), chunked predictions equal the unchunked ShardTensor forward."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meshshard.cli import main
from meshshard.testing.distributed import run_ranks
from tests.apps._fns import cli_rank, predict_rank

FIELDS = ("pMeanTrim", "wallShearStressMeanTrim", "CpMeanTrim")


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def one_process(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("pred1")
    argv = ["predict", str(trained["ckpt"]), str(trained["raw"] / "run_2"), "--out", str(out),
            "--max-points-per-chunk", "700"]
    assert main(argv) == 0
    argv = ["predict", str(trained["ckpt"]), str(trained["curator"]), "--out", str(out / "c"),
            "--no-png"]
    assert main(argv) == 0
    return out


def test_writes_vtk_png_json(trained, one_process, capsys):
    import pyvista as pv

    src = pv.read(trained["raw"] / "run_2" / "boundary_2.vtp")
    got = pv.read(one_process / "run_2" / "boundary_2.vtp")
    assert (got.n_points, got.n_cells) == (src.n_points, src.n_cells)
    np.testing.assert_array_equal(got.points, src.points)
    for f in FIELDS:
        assert f"{f}Pred" in got.cell_data
        np.testing.assert_array_equal(got.cell_data[f], src.cell_data[f])  # the truth kept
        assert got.cell_data[f"{f}Pred"].shape == src.cell_data[f].shape
        assert np.isfinite(got.cell_data[f"{f}Pred"]).all()
    png = one_process / "run_2" / "pressure.png"
    assert png.stat().st_size > 10_000
    meta = json.loads((one_process / "run_2" / "prediction.json").read_text())
    assert meta["cells"] == src.n_cells and set(meta["rel_l2"]) == set(FIELDS)
    # the JSON's error is the error of the arrays written
    p, t = got.cell_data["pMeanTrimPred"], got.cell_data["pMeanTrim"]
    assert abs(_rel(p, t) - meta["rel_l2"]["pMeanTrim"]) < 1e-5
    # a store has no VTK: a point cloud of the centres with predicted and true arrays
    cloud = pv.read(one_process / "c" / "run_2" / "surface.vtp")
    assert cloud.n_points == src.n_cells and "pMeanTrimPred" in cloud.point_data


def test_two_ranks_equal_one_process(trained, one_process, tmp_path):
    import pyvista as pv

    argvs = [["predict", str(trained["ckpt"]), str(trained["raw"] / "run_2"), "--out",
              str(tmp_path), "--max-points-per-chunk", "333", "--no-png"],
             ["predict", str(trained["ckpt"]), str(trained["curator"]), "--out",
              str(tmp_path / "c"), "--no-png"]]
    out = run_ranks(cli_rank, 2, argvs, timeout=300)
    for res in out:
        assert [r[0] for r in res] == [0, 0], res
    assert "on 2 rank(s)" in out[0][0][1]
    one = pv.read(one_process / "run_2" / "boundary_2.vtp")
    two = pv.read(tmp_path / "run_2" / "boundary_2.vtp")
    for f in FIELDS:
        assert _rel(two.cell_data[f"{f}Pred"], one.cell_data[f"{f}Pred"]) <= 1e-5
    # the curator store: rows in another order (partitioned), same values per source row
    c1 = pv.read(one_process / "c" / "run_2" / "surface.vtp")
    c2 = pv.read(tmp_path / "c" / "run_2" / "surface.vtp")
    np.testing.assert_array_equal(c1.points, c2.points)
    assert _rel(c2.point_data["pMeanTrimPred"], c1.point_data["pMeanTrimPred"]) <= 1e-5
    # ... and the same as the VTK input's predictions (same rows, same order of cells)
    assert _rel(c1.point_data["pMeanTrimPred"], one.cell_data["pMeanTrimPred"]) <= 1e-5


def test_three_ranks_repartitioned_store(trained):
    store = trained["stores"] / "run_3.zarr"  # 2 parts: 3 ranks repartition
    out = run_ranks(predict_rank, 3, str(trained["ckpt"]), str(store), 150, timeout=300)
    assert [len(o["perm"]) for o in out] == out[0]["sizes"]
    chunked = np.concatenate([o["pred"][150] for o in out])
    whole = np.concatenate([o["pred"][None] for o in out])
    assert _rel(chunked, whole) <= 1e-5
    for o in out:  # chunked kNN features == build_inputs (fp32 rounding of the same sums)
        for got, want in zip(o["inputs"][150], o["inputs"][None]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    perm = np.concatenate([o["perm"] for o in out])
    assert sorted(perm.tolist()) == list(range(perm.size))


def test_flow_speed_from_the_option_else_the_model(trained, one_process, tmp_path):
    """On a run directory --u-inf scales the written fields (as U^2) and the report says so;
    without it the model file's recorded speed is used, not a silent default."""
    import pyvista as pv

    s = json.loads((one_process / "run_2" / "prediction.json").read_text())
    assert s["u_inf"] == 38.889 and s["u_inf_from"].startswith("model file")
    assert s["conventions"]["normals"] == "into_body"
    from meshshard.apps.model_file import load_model

    assert load_model(trained["ckpt"]).scales["conventions"]["normals"] == "into_body"
    argv = ["predict", str(trained["ckpt"]), str(trained["raw"] / "run_2"), "--out",
            str(tmp_path), "--max-points-per-chunk", "700", "--u-inf", "20", "--no-png"]
    assert main(argv) == 0
    s20 = json.loads((tmp_path / "run_2" / "prediction.json").read_text())
    assert s20["u_inf"] == 20.0 and s20["u_inf_from"] == "--u-inf"
    a = pv.read(one_process / "run_2" / "boundary_2.vtp").cell_data["pMeanTrimPred"]
    b = pv.read(tmp_path / "run_2" / "boundary_2.vtp").cell_data["pMeanTrimPred"]
    # the same non-dimensional input geometry: the raw prediction scales with U^2
    np.testing.assert_allclose(b, a * (20.0 / 38.889) ** 2, rtol=1e-5, atol=1e-6)
    # the errors compare like with like: the truth is scaled with the same speed
    assert s20["rel_l2"]["pMeanTrim"] != pytest.approx(s["rel_l2"]["pMeanTrim"], rel=1e-3)
