"""``meshshard evaluate``: truth against truth gives drag and lift equal to an independent
computation with exact (Newell) polygon area vectors (to 1e-6), from run directories,
meshshard stores and curator stores, on 1 and 2 ranks; with a model, the table, JSON and PNG,
and R^2 as defined."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meshshard.apps.evaluate import evaluate_one, evaluate_runs
from meshshard.apps.figures import r_squared
from meshshard.cli import main
from meshshard.testing.distributed import run_ranks
from tests.apps._fns import cli_rank
from tests.apps._newell import newell_coefficients

U_INF, RHO = 38.889, 1.0  # DRIVAERML's reference values (the synthetic runs use them)


def pyvista_coefficients(vtp, a_ref: float | None = None) -> dict:
    """Drag and lift from the raw VTK arrays with exact (Newell) polygon area vectors, in
    OpenFOAM's conventions (:mod:`tests.apps._newell`), independent of meshshard's geometry."""
    return newell_coefficients(vtp, u_inf=U_INF, rho=RHO, a_ref=a_ref)


def _close(a: float, b: float, tol: float = 1e-6) -> bool:
    return abs(a - b) <= tol * abs(b)


@pytest.mark.parametrize("a_ref", [None, 2.31])
def test_truth_equals_pyvista(trained, a_ref):
    for i in (1, 2, 3):
        ref = pyvista_coefficients(trained["raw"] / f"run_{i}" / f"boundary_{i}.vtp", a_ref)
        sources = [trained["raw"] / f"run_{i}", trained["stores"] / f"run_{i}.zarr"]
        if i == 2:
            sources.append(trained["curator"])
        for src in sources:
            r = evaluate_one(src, reference_area=a_ref)
            assert _close(r["cd_true"], ref["cd"]), (src, r["cd_true"], ref["cd"])
            assert _close(r["cl_true"], ref["cl"]), (src, r["cl_true"], ref["cl"])
            assert _close(r["reference_area"], ref["a_ref"])
            assert r["cd_pred"] == r["cd_true"] and all(v == 0 for v in r["rel_l2"].values())


def test_truth_on_two_ranks(trained, tmp_path):
    argv = [["evaluate", str(trained["raw"] / "run_2"), str(trained["curator"]),
             str(trained["stores"] / "run_3.zarr"), "--out", str(tmp_path), "--no-png"]]
    out = run_ranks(cli_rank, 2, argv, timeout=300)
    assert out[0][0][0] == 0 and out[1][0][0] == 0, out
    res = json.loads((tmp_path / "evaluation.json").read_text())
    refs = [pyvista_coefficients(trained["raw"] / f"run_{i}" / f"boundary_{i}.vtp")
            for i in (2, 2, 3)]
    for r, ref in zip(res["runs"], refs):
        assert _close(r["cd_true"], ref["cd"]) and _close(r["cl_true"], ref["cl"])
    assert "R^2 drag 1.0000" in out[0][0][1]


def test_with_model_table_json_png(trained, tmp_path, capsys):
    rc = main(["evaluate", str(trained["stores"]), "--checkpoint", str(trained["ckpt"]),
               "--out", str(tmp_path), "--max-points-per-chunk", "500"])
    text = capsys.readouterr().out
    assert rc == 0
    res = json.loads((tmp_path / "evaluation.json").read_text())
    assert [r["run"] for r in res["runs"]] == ["run_1", "run_2", "run_3"]
    table = (tmp_path / "evaluation.txt").read_text()
    assert table.strip() in text
    for r in res["runs"]:
        assert r["run"] in table and r["rel_l2"]["pMeanTrim"] > 0
        assert f"{r['cd_pred']:.4f}" in table
    cd_p = [r["cd_pred"] for r in res["runs"]]
    cd_t = [r["cd_true"] for r in res["runs"]]
    assert res["summary"]["r2_cd"] == pytest.approx(r_squared(cd_p, cd_t))
    t = np.asarray(cd_t)
    manual = 1 - ((np.asarray(cd_p) - t) ** 2).sum() / ((t - t.mean()) ** 2).sum()
    assert res["summary"]["r2_cd"] == pytest.approx(manual)
    assert (tmp_path / "evaluation.png").stat().st_size > 10_000
    # the model's predictions differ from the truth, so does its drag
    assert all(r["cd_pred"] != r["cd_true"] for r in res["runs"])


def test_no_runs_and_bad_runs(trained, tmp_path):
    with pytest.raises(ValueError, match="no runs"):
        evaluate_runs([], tmp_path)
    rc = main(["evaluate", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert rc == 2


def _run_with_geo_ref(trained, tmp_path, text: str):
    """run_1 copied into ``tmp_path`` with a ``geo_ref_1.csv`` holding ``text``."""
    import shutil

    run = tmp_path / "run_1"
    shutil.copytree(trained["raw"] / "run_1", run)
    (run / "geo_ref_1.csv").write_text(text)
    return run


def test_geo_ref_csv_gives_the_reference_area(trained, tmp_path):
    run = _run_with_geo_ref(trained, tmp_path, "lRef,aRef,note\n2.786,2.17,baseline\n")
    ref = pyvista_coefficients(run / "boundary_1.vtp", 2.17)
    r = evaluate_one(run)
    assert r["reference_area"] == 2.17 and r["reference_area_from"] == "geo_ref_1.csv"
    assert _close(r["cd_true"], ref["cd"]) and _close(r["cl_true"], ref["cl"])
    r = evaluate_one(run, reference_area=3.0)  # the option wins
    assert r["reference_area"] == 3.0 and r["reference_area_from"] == "--reference-area"
    r = evaluate_one(trained["raw"] / "run_1")  # no file: the frontal area
    assert r["reference_area_from"] == "frontal area (estimate)"


@pytest.mark.parametrize("text", ["lRef,aRef\n", "lRef,aRef\n1,2\n1,2\n", "lRef\n2.7\n",
                                  "lRef,aRef\n2.7,-1\n", "lRef,aRef\n2.7,nan\n"])
def test_bad_geo_ref_csv_is_one_line(trained, tmp_path, capsys, text):
    run = _run_with_geo_ref(trained, tmp_path, text)
    assert main(["evaluate", str(run), "--out", str(tmp_path / "ev")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "geo_ref_1.csv" in err, err
    assert not (tmp_path / "ev" / "evaluation.json").exists()
