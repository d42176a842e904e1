"""Drag and lift against the solver, not against ourselves: ``evaluate`` on the true fields of
a real OpenFOAM case (``tests/data/openfoam``) reproduces the solver's own ``forceCoeffs`` Cd
and Cl, pressure and viscous parts, to 1e-5 relative, from the run directory and from a store,
on 1 and 2 ranks; the conventions, flow speed, reference area and field names that decide it
are checked one by one, and every user error on this path is one line, exit 2."""

from __future__ import annotations

import json

import pytest

from meshshard.apps.evaluate import evaluate_one
from meshshard.cli import main
from meshshard.testing.distributed import run_ranks
from tests.apps._fns import cli_rank
from tests.apps._newell import newell_coefficients
from tests.openfoam_case import RUN, SOLVER, U_INF, openfoam_run

#: measured: 1.1e-8 (Cd) to 9.7e-8 (Cl) from float32 VTK arrays; the issue's bar is 1e-5
TOL = 1e-5
PARTS = {"cd": ("Cd", "total"), "cd_pressure": ("Cd", "pressure"),
         "cd_shear": ("Cd", "viscous"), "cl": ("Cl", "total"),
         "cl_pressure": ("Cl", "pressure"), "cl_shear": ("Cl", "viscous")}


def _assert_solver(forces: dict, tol: float = TOL) -> None:
    for key, (c, part) in PARTS.items():
        want = SOLVER["coefficients"][c][part]
        assert abs(forces[key] - want) <= tol * abs(want), (key, forces[key], want)


@pytest.fixture(scope="module")
def case(tmp_path_factory, world_of_one):
    root = tmp_path_factory.mktemp("openfoam")
    run = openfoam_run(root / "raw")
    rc = main(["preprocess", "drivaerml", str(root / "raw"), str(root / "stores"), "--parts",
               "2", "--surface", "--u-inf", str(U_INF), "--fields", "openfoam",
               "--no-progress"])
    assert rc == 0
    return {"run": run, "store": root / "stores" / "run_1.zarr", "root": root}


def test_the_independent_newell_sum_is_the_solver(case):
    """The committed data and the stated conventions, without meshshard."""
    got = newell_coefficients(RUN / "boundary_1.vtp", u_inf=U_INF, a_ref=SOLVER["Aref"],
                              p="p", tau="wallShearStress")
    _assert_solver(got, 1e-6)


def test_run_directory_and_store_reproduce_the_solver(case):
    r = evaluate_one(case["run"], u_inf=U_INF, fields="openfoam")
    _assert_solver(r["forces_true"])
    assert r["reference_area_from"] == "geo_ref_1.csv" and r["u_inf_from"] == "--u-inf"
    conv = r["conventions"]
    assert conv["normals"] == conv["file_normals"] == "into_body"
    assert conv["from"] == "signed volume" and conv["signed_volume"] < 0
    s = evaluate_one(case["store"])  # speed, reference area and conventions from the store
    _assert_solver(s["forces_true"])
    assert s["reference_area"] == SOLVER["Aref"]
    assert s["reference_area_from"] == "geo_ref_1.csv (recorded in the store)"
    assert s["u_inf"] == U_INF and s["conventions"]["normals"] == "into_body"
    # what travels in the store: conventions, reference values, the field map, the speed
    from meshshard.store.format import open_store

    _, attrs = open_store(case["store"])
    assert attrs["surface"]["conventions"]["file_normals"] == "into_body"
    assert attrs["reference"] == {"aRef": 0.75, "lRef": 1.42, "from": "geo_ref_1.csv"}
    assert attrs["dataset"]["field_sources"]["pMeanTrim"] == "p"
    assert attrs["dataset"]["u_inf"] == U_INF


def test_two_ranks_reproduce_the_solver(case, tmp_path):
    argv = [["evaluate", str(case["run"]), str(case["store"]), "--u-inf", str(U_INF),
             "--fields", "openfoam", "--out", str(tmp_path), "--no-png"]]
    out = run_ranks(cli_rank, 2, argv, timeout=300)
    assert out[0][0][0] == 0 and out[1][0][0] == 0, out
    res = json.loads((tmp_path / "evaluation.json").read_text())
    assert len(res["runs"]) == 2
    for r in res["runs"]:
        _assert_solver(r["forces_true"])


def test_each_convention_decides_a_sign(case):
    """Stating the wrong convention flips exactly its part: the options are not decoration."""
    base = evaluate_one(case["run"], u_inf=U_INF, fields="openfoam")["forces_true"]
    out = evaluate_one(case["run"], u_inf=U_INF, fields="openfoam",
                       conventions={"normals": "out_of_body"})["forces_true"]
    assert out["cd_pressure"] == pytest.approx(-base["cd_pressure"], rel=1e-12)
    assert out["cd_shear"] == pytest.approx(base["cd_shear"], rel=1e-12)
    body = evaluate_one(case["run"], u_inf=U_INF, fields="openfoam",
                        conventions={"shear": "on_body"})["forces_true"]
    assert body["cd_shear"] == pytest.approx(-base["cd_shear"], rel=1e-12)
    assert body["cd_pressure"] == pytest.approx(base["cd_pressure"], rel=1e-12)


def test_flow_speed_scales_as_the_square(case):
    """Without --u-inf (and no model) a run directory is read at DrivaerML's 38.889 m/s: the
    coefficients come out (20 / 38.889)^2 of the solver's; the report says where U came from."""
    r = evaluate_one(case["run"], fields="openfoam")
    assert r["u_inf"] == 38.889 and r["u_inf_from"] == "DrivaerML default"
    ratio = (U_INF / 38.889) ** 2
    assert r["cd_true"] == pytest.approx(SOLVER["coefficients"]["Cd"]["total"] * ratio, rel=TOL)


def _one_line(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, (rc, err)
    return err


def test_user_errors_are_one_line(case, capsys, tmp_path):
    out = ["--out", str(tmp_path / "ev"), "--no-png"]
    run, store = str(case["run"]), str(case["store"])
    err = _one_line(capsys, ["evaluate", run, "--u-inf", "20", *out])  # OpenFOAM names
    assert "pMeanTrim" in err and "--fields" in err
    err = _one_line(capsys, ["evaluate", run, "--fields", "p", *out])
    assert "FILE=SCHEMA" in err
    err = _one_line(capsys, ["evaluate", run, "--fields", "p=pressure", *out])
    assert "pressure" in err and "pMeanTrim" in err
    err = _one_line(capsys, ["evaluate", run, "--fields", "openfoam", "--u-inf", "-3", *out])
    assert "--u-inf" in err
    err = _one_line(capsys, ["evaluate", store, "--u-inf", "30", *out])
    assert "u_inf=20" in err
    err = _one_line(capsys, ["evaluate", run, "--fields", "openfoam", "--reference-area", "0",
                             *out])
    assert "--reference-area" in err
    assert not (tmp_path / "ev" / "evaluation.json").exists()


def test_an_open_surface_asks_for_the_orientation(case, tmp_path, capsys):
    """The left half of the body (|sum n A| / sum A = 0.37): too open to read the orientation
    from; one line naming the option, and stating it reads the file."""
    import numpy as np
    import pyvista as pv

    run = openfoam_run(tmp_path / "half")
    m = pv.read(run / "boundary_1.vtp")
    y = m.cell_centers().points[:, 1]
    half = m.extract_cells(np.flatnonzero(y < np.median(y))).extract_surface(
        algorithm="dataset_surface", pass_pointid=False, pass_cellid=False)
    half.save(run / "boundary_1.vtp")
    err = _one_line(capsys, ["evaluate", str(run), "--fields", "openfoam", "--u-inf", "20",
                             "--out", str(tmp_path / "ev"), "--no-png"])
    assert "--normals" in err and "boundary_1.vtp" in err
    assert main(["evaluate", str(run), "--fields", "openfoam", "--u-inf", "20", "--normals",
                 "into-body", "--out", str(tmp_path / "ev"), "--no-png"]) == 0
