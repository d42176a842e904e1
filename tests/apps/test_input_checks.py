"""predict/evaluate refuse, before the model runs and naming the run, the inputs that gave
wrong numbers with exit 0 (Cd = 0 from an infinite reference area, NaN errors from NaN truth,
zero-filled truth from a missing chunk, a surface read as a volume) or ran for hours (one
point per chunk)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from meshshard.apps.evaluate import evaluate_one
from meshshard.cli import main
from meshshard.errors import InputError


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def curator_copy(trained, tmp_path):
    dst = tmp_path / "run_2.zarr"
    shutil.copytree(trained["curator"], dst)
    return dst


def _set(store, key, row, col, value):
    """One value of a curator array rewritten in place (its chunking kept)."""
    import zarr

    a = zarr.open_array(str(store / key), mode="r+")
    if col is None:
        a[row] = value
    else:
        a[row, col] = value


@pytest.mark.parametrize(("key", "col", "value", "cause"), [
    ("surface_areas", None, 0.0, "surface cell areas are zero"),
    ("surface_areas", None, -1.0, "surface cell areas are negative"),
    ("surface_areas", None, np.nan, "array surface_areas has 1 row(s) with NaN or inf"),
    ("surface_normals", 0, np.nan, "array surface_normals has 1 row(s) with NaN or inf"),
    ("surface_normals", slice(None), 0.0, "surface normals are not unit vectors"),
    ("surface_fields", 0, np.inf, "array surface_fields has 1 row(s) with NaN or inf"),
])
def test_bad_geometry_or_truth_is_named_before_the_model(trained, curator_copy, tmp_path,
                                                         capsys, key, col, value, cause):
    """Found only as 'reference area ... must be > 0' after the model ran, naming neither
    the run nor the cause (and NaN truth gave rel_l2 NaN with exit 0)."""
    _set(curator_copy, key, 5, col, value)
    rc = main(["evaluate", str(trained["stores"] / "run_1.zarr"), str(curator_copy),
               "--checkpoint", str(trained["ckpt"]), "--out", str(tmp_path / "e"), "--no-png"])
    err = _err(capsys)
    assert rc == 2, err
    assert str(curator_copy) in err and cause in err, err
    assert "first at row 5)" in err or "first at row 5;" in err, err  # the store's row


def test_tiny_coordinates_name_the_units(trained, tmp_path, capsys):
    """A mesh in the wrong units: float32 areas underflow to 0; said so, before the model."""
    import pyvista as pv

    run = tmp_path / "run_1"
    shutil.copytree(trained["raw"] / "run_1", run)
    m = pv.read(run / "boundary_1.vtp")
    m.points = (np.asarray(m.points, dtype=np.float64) * 1e-30).astype(np.float32)
    m.save(run / "boundary_1.vtp")
    rc = main(["predict", str(trained["ckpt"]), str(run), "--out", str(tmp_path / "p"),
               "--no-png"])
    err = _err(capsys)
    assert rc == 2 and str(run) in err and "areas underflow to 0 in float32" in err, err


def test_missing_chunk_in_evaluate_is_exit_2(trained, curator_copy, tmp_path, capsys):
    """A deleted chunk gave all-zero truth and Cd 0.150 against 0.090 with exit 0."""
    chunks = sorted((curator_copy / "surface_fields" / "c").iterdir())
    shutil.rmtree(chunks[0])
    rc = main(["evaluate", str(curator_copy), "--out", str(tmp_path / "e"), "--no-png"])
    err = _err(capsys)
    assert rc == 2 and "surface_fields" in err and "would read as zeros" in err, err


def test_absurd_density_in_a_meshshard_store(trained, tmp_path):
    """air density 1e308 gave inf fields."""
    store = tmp_path / "run_1.zarr"
    shutil.copytree(trained["stores"] / "run_1.zarr", store)
    meta = json.loads((store / "zarr.json").read_text())
    meta["attributes"]["dataset"]["rho"] = 1e308
    (store / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"density 1e\+308 kg/m\^3 must lie in") as e:
        evaluate_one(store)
    assert str(store) in str(e.value)


@pytest.mark.parametrize(("args", "match"), [
    (["--reference-area", "inf"], "--reference-area inf: must be a finite area > 0"),
    (["--reference-area", "0"], "--reference-area 0.0: must be a finite area > 0"),
    (["--reference-area", "nan"], "--reference-area nan: must be a finite area > 0"),
    (["--max-points-per-chunk", "1"], "--max-points-per-chunk 1 is below 256"),
])
@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_options_are_bounded(trained, tmp_path, capsys, command, args, match):
    """--reference-area inf gave Cd = 0; one point per chunk ran for hours."""
    run = str(trained["raw"] / "run_1")
    argv = ([command, str(trained["ckpt"]), run] if command == "predict"
            else [command, run, "--checkpoint", str(trained["ckpt"])])
    rc = main([*argv, "--out", str(tmp_path / "o"), *args])
    err = _err(capsys)
    assert rc == 2 and match in err, err
    assert not (tmp_path / "o").exists()  # refused before any work


def test_reference_area_api(trained, tmp_path):
    from meshshard.apps.predict import predict_run

    with pytest.raises(InputError, match="reference_area inf: must be a finite area > 0"):
        predict_run(trained["ckpt"], trained["raw"] / "run_1", tmp_path, reference_area=np.inf)
    with pytest.raises(InputError, match="reference_area -2"):
        evaluate_one(trained["raw"] / "run_1", reference_area=-2)


def test_triangles_are_not_a_volume(trained, world_of_one, tmp_path):
    """A .vtu of 2-D triangles was read as a volume (exit 0)."""
    import pyvista as pv

    from meshshard.apps.volume_inputs import read_volume_rows

    run = tmp_path / "run_1"
    shutil.copytree(trained["raw"] / "run_1", run)
    surf = pv.read(run / "boundary_1.vtp").triangulate()
    grid = surf.cast_to_unstructured_grid()
    grid.save(run / "volume_1.vtu")
    with pytest.raises(InputError, match=rf"volume_1.vtu: {grid.n_cells:,} of {grid.n_cells:,} "
                       r"cells are not 3-D \([\d,]+ TRIANGLE\)"):
        read_volume_rows(run)


def test_every_error_names_the_run():
    from meshshard.apps.input_checks import run_named

    with pytest.raises(ValueError, match=r"^runs/run_7: reference area 0.0 must be > 0$"):
        with run_named("runs/run_7"):
            raise ValueError("reference area 0.0 must be > 0")
    with pytest.raises(ValueError, match=r"^runs/run_7/x.vtp: bad$"):  # already named: kept
        with run_named("runs/run_7"):
            raise ValueError("runs/run_7/x.vtp: bad")


def test_zero_truth_is_not_a_nan_error(trained, tmp_path, capsys):
    """A field zero on every row gave rel_l2 NaN with exit 0."""
    import pyvista as pv

    run = tmp_path / "run_1"
    shutil.copytree(trained["raw"] / "run_1", run)
    m = pv.read(run / "boundary_1.vtp")
    m.cell_data["pMeanTrim"] = np.zeros(m.n_cells, dtype=np.float32)
    m.save(run / "boundary_1.vtp")
    rc = main(["evaluate", str(run), "--checkpoint", str(trained["ckpt"]), "--out",
               str(tmp_path / "e"), "--no-png"])
    err = _err(capsys)
    assert rc == 2 and str(run) in err and "true field pMeanTrim is zero on every row" in err


def test_non_finite_predictions_are_refused(trained, tmp_path, capsys):
    """Finite weights and a finite (huge) target_std overflow float32: no NaN/inf written."""
    ck = tmp_path / "ck"
    shutil.copytree(trained["ckpt"], ck)
    meta = json.loads((ck / "model.json").read_text())
    meta["scales"]["target_std"] = [3e38] * len(meta["scales"]["target_std"])
    (ck / "model.json").write_text(json.dumps(meta))
    rc = main(["predict", str(ck), str(trained["raw"] / "run_1"), "--out", str(tmp_path / "p"),
               "--no-png"])
    err = _err(capsys)
    assert rc == 2 and "predictions are NaN or inf" in err and "run_1" in err, err
    assert not list((tmp_path / "p").rglob("*.vtp"))


def test_many_chunk_rounds_warn_with_an_estimate(caplog):
    from meshshard.apps.input_checks import warn_rounds

    with caplog.at_level("WARNING"):
        warn_rounds(1_000_000, 256, "runs/run_3")
        warn_rounds(1_000_000, 262_144, "runs/run_4")
    assert len(caplog.records) == 1
    assert "runs/run_3: 1000000 rows per rank in chunks of 256 make 3907 model passes" in \
        caplog.records[0].getMessage()
