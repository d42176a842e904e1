"""Volume models: ``predict`` writes a copy of the ``.vtu`` that pyvista reads back with the
input's point and cell counts and ``<field>Pred`` arrays; ``evaluate``'s volume relative L2
equals an independent numpy computation on those arrays; the same predictions from 1 process
and 2 ranks (run directory, meshshard store, curator store); chunked equals unchunked on 1, 2
and 3 ranks (3 ranks repartition a 2-part store: uneven shards); bad inputs are one-line
errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meshshard.cli import main
from meshshard.testing.distributed import run_ranks
from tests.apps._fns import cli_rank, volume_rank

FIELDS = ("UMeanTrim", "pMeanTrim", "nutMeanTrim")


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def one_process(trained_volume, tmp_path_factory):
    out = tmp_path_factory.mktemp("vpred1")
    tv = trained_volume
    for src, sub in ((tv["raw"] / "run_2", "raw"), (tv["curator"] / "run_2.zarr", "cur"),
                     (tv["stores"] / "run_2.zarr", "store")):
        argv = ["predict", str(tv["ckpt"]), str(src), "--out", str(out / sub),
                "--max-points-per-chunk", "400"]
        assert main(argv) == 0
    return out


def test_predict_writes_vtu(trained_volume, one_process, capsys):
    import pyvista as pv

    src = pv.read(trained_volume["raw"] / "run_2" / "volume_2.vtu")
    got = pv.read(one_process / "raw" / "run_2" / "volume_2.vtu")
    assert (got.n_points, got.n_cells) == (src.n_points, src.n_cells)
    np.testing.assert_array_equal(got.points, src.points)
    for f in FIELDS:
        np.testing.assert_array_equal(got.cell_data[f], src.cell_data[f])  # the truth kept
        assert got.cell_data[f"{f}Pred"].shape == src.cell_data[f].shape
        assert np.isfinite(got.cell_data[f"{f}Pred"]).all()
    meta = json.loads((one_process / "raw" / "run_2" / "prediction.json").read_text())
    assert meta["part"] == "volume" and meta["cells"] == src.n_cells
    # the JSON's errors are those of the arrays written (raw units; the scale cancels)
    for f in FIELDS:
        want = _rel(got.cell_data[f"{f}Pred"], got.cell_data[f])
        assert abs(meta["rel_l2"][f] - want) <= 1e-5 * want, (f, meta["rel_l2"][f], want)
    # stores have no .vtu: a point cloud of the cell centres, same values per source row
    for sub in ("cur", "store"):
        cloud = pv.read(one_process / sub / "run_2" / "volume.vtp")
        assert cloud.n_points == src.n_cells
        for f in FIELDS:
            assert _rel(cloud.point_data[f"{f}Pred"], got.cell_data[f"{f}Pred"]) <= 1e-5
            np.testing.assert_allclose(cloud.point_data[f], src.cell_data[f], rtol=1e-5,
                                       atol=1e-6 * np.abs(src.cell_data[f]).max())


def _numpy_rel_l2(pred_vtu, truth_vtu) -> dict[str, float]:
    """Relative L2 per field from the written predictions and the input file's truth."""
    import pyvista as pv

    p, t = pv.read(pred_vtu), pv.read(truth_vtu)
    out = {}
    for f in FIELDS:
        a = np.asarray(p.cell_data[f"{f}Pred"], dtype=np.float64)
        b = np.asarray(t.cell_data[f], dtype=np.float64)
        out[f] = float(np.sqrt(((a - b) ** 2).sum() / (b**2).sum()))
    return out


def test_flow_speed_scales_the_written_volume_fields(trained_volume, one_process, tmp_path):
    """--u-inf on a run directory: U written as U_inf u*, p as U_inf^2 p* (nut as U_inf L)."""
    import pyvista as pv

    tv = trained_volume
    argv = ["predict", str(tv["ckpt"]), str(tv["raw"] / "run_2"), "--out", str(tmp_path),
            "--max-points-per-chunk", "400", "--u-inf", "20"]
    assert main(argv) == 0
    a = pv.read(one_process / "raw" / "run_2" / "volume_2.vtu")
    b = pv.read(tmp_path / "run_2" / "volume_2.vtu")
    r = 20.0 / 38.889
    for f, k in (("UMeanTrim", r), ("pMeanTrim", r * r), ("nutMeanTrim", r)):
        np.testing.assert_allclose(b.cell_data[f"{f}Pred"], a.cell_data[f"{f}Pred"] * k,
                                   rtol=2e-5, atol=1e-7)


def test_evaluate_volume_equals_numpy(trained_volume, one_process, tmp_path, capsys):
    import pyvista as pv

    tv = trained_volume
    n_cells = pv.read(tv["raw"] / "run_2" / "volume_2.vtu").n_cells
    rc = main(["evaluate", str(tv["raw"] / "run_2"), str(tv["curator"] / "run_2.zarr"),
               "--checkpoint", str(tv["ckpt"]), "--out", str(tmp_path), "--no-png"])
    assert rc == 0
    res = json.loads((tmp_path / "evaluation.json").read_text())
    want = _numpy_rel_l2(one_process / "raw" / "run_2" / "volume_2.vtu",
                         tv["raw"] / "run_2" / "volume_2.vtu")
    for r in res["runs"]:
        assert r["volume_cells"] == n_cells
        for f in FIELDS:
            got = r["rel_l2"][f"volume:{f}"]
            # float32 predictions written to the file against the float32 model output
            assert abs(got - want[f]) <= 1e-5 * want[f], (r["run"], f, got, want[f])
        assert r["cd_true"] is None  # volume alone: no drag (nan -> null)
    table = (tmp_path / "evaluation.txt").read_text()
    assert "L2 volume:UMeanTrim" in table and "volume cells" in table


def test_evaluate_surface_and_volume_models(trained, trained_volume, tmp_path, capsys):
    """A surface and a volume checkpoint together: the surface's errors and drag beside the
    volume fields' errors; two volume checkpoints are refused in one line."""
    tv = trained_volume
    run = str(tv["raw"] / "run_2")
    rc = main(["evaluate", run, "--checkpoint", str(trained["ckpt"]), "--checkpoint",
               str(tv["ckpt"]), "--out", str(tmp_path), "--no-png"])
    assert rc == 0
    r = json.loads((tmp_path / "evaluation.json").read_text())["runs"][0]
    assert {"pMeanTrim", "wallShearStressMeanTrim"} <= set(r["rel_l2"])
    assert {f"volume:{f}" for f in FIELDS} <= set(r["rel_l2"])
    assert np.isfinite(r["cd_pred"]) and np.isfinite(r["cd_true"])
    capsys.readouterr()
    rc = main(["evaluate", run, "--checkpoint", str(tv["ckpt"]), "--checkpoint",
               str(tv["ckpt"]), "--out", str(tmp_path / "x"), "--no-png"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1 and "second volume model" in err, err


def test_two_ranks_equal_one_process(trained_volume, one_process, tmp_path):
    import pyvista as pv

    tv = trained_volume
    argvs = [["predict", str(tv["ckpt"]), str(tv["raw"] / "run_2"), "--out", str(tmp_path),
              "--max-points-per-chunk", "333"],
             ["predict", str(tv["ckpt"]), str(tv["curator"] / "run_2.zarr"), "--out",
              str(tmp_path / "cur")],
             ["evaluate", str(tv["raw"] / "run_2"), "--checkpoint", str(tv["ckpt"]), "--out",
              str(tmp_path / "ev"), "--no-png"]]
    out = run_ranks(cli_rank, 2, argvs, timeout=300)
    for res in out:
        assert [r[0] for r in res] == [0, 0, 0], res
    assert "volume cells on 2 rank(s)" in out[0][0][1]
    src = pv.read(tv["raw"] / "run_2" / "volume_2.vtu")
    one = pv.read(one_process / "raw" / "run_2" / "volume_2.vtu")
    two = pv.read(tmp_path / "run_2" / "volume_2.vtu")
    assert (two.n_points, two.n_cells) == (src.n_points, src.n_cells)
    c2 = pv.read(tmp_path / "cur" / "run_2" / "volume.vtp")
    for f in FIELDS:
        assert _rel(two.cell_data[f"{f}Pred"], one.cell_data[f"{f}Pred"]) <= 1e-5
        assert _rel(c2.point_data[f"{f}Pred"], one.cell_data[f"{f}Pred"]) <= 1e-5
    ev = json.loads((tmp_path / "ev" / "evaluation.json").read_text())["runs"][0]
    want = _numpy_rel_l2(tmp_path / "run_2" / "volume_2.vtu", tv["raw"] / "run_2" /
                         "volume_2.vtu")
    for f in FIELDS:
        assert abs(ev["rel_l2"][f"volume:{f}"] - want[f]) <= 1e-5 * want[f]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_chunked_equals_unchunked(trained_volume, world):
    tv = trained_volume
    sources = [str(tv["stores"] / "run_1.zarr"), str(tv["curator"] / "run_2.zarr")]
    out = run_ranks(volume_rank, world, str(tv["ckpt"]), sources, 97, timeout=300)
    for src in sources:
        per = [o[src] for o in out]
        assert [len(p["perm"]) for p in per] == per[0]["sizes"]
        chunked = np.concatenate([p["pred"][97] for p in per])
        whole = np.concatenate([p["pred"][None] for p in per])
        assert _rel(chunked, whole) <= 1e-5, (src, world)
        for p in per:  # the inputs do not depend on the chunk (pointwise distances)
            for a, b in zip(p["inputs"][97], p["inputs"][None]):
                np.testing.assert_array_equal(a, b)
        perm = np.concatenate([p["perm"] for p in per])
        assert sorted(perm.tolist()) == list(range(perm.size))
    # 3 ranks over a 2-part store: repartitioned into 3
    assert len(out[0][sources[0]]["sizes"]) == world


def test_errors_are_one_line(trained_volume, tmp_path, capsys):
    import shutil

    tv = trained_volume
    run = tmp_path / "run_2"
    shutil.copytree(tv["raw"] / "run_2", run)
    (run / "drivaer_2.stl").unlink()
    assert main(["predict", str(tv["ckpt"]), str(run), "--out", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "STL" in err, err
    (run / "volume_2.vtu").unlink()
    shutil.copy(tv["raw"] / "run_2" / "drivaer_2.stl", run)
    assert main(["predict", str(tv["ckpt"]), str(run), "--out", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "volume_2.vtu" in err, err


def test_example_trains_a_volume_model(trained_volume, tmp_path):
    """``examples/train_drivaerml.py --part volume``: a model checkpoint with inputs.part =
    "volume" that ``predict`` runs on the volume cells (a .vtu copy with the Pred arrays)."""
    import subprocess
    import sys
    from pathlib import Path

    import pyvista as pv

    root = Path(__file__).resolve().parents[2]
    tv = trained_volume
    ck = tmp_path / "ck"
    r = subprocess.run(
        [sys.executable, str(root / "examples" / "train_drivaerml.py"), str(tv["stores"]),
         "--part", "volume", "--steps", "3", "--hidden", "8", "--layers", "1", "--slices",
         "4", "--checkpoint", str(ck), "--val-fraction", "0.5"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "validation (1 runs" in r.stderr and "UMeanTrim" in r.stderr, r.stderr
    meta = json.loads((tmp_path / "ck-model" / "model.json").read_text())
    assert meta["inputs"]["part"] == "volume"
    assert [f[0] for f in meta["fields"]] == list(FIELDS)
    assert main(["predict", str(tmp_path / "ck-model"), str(tv["raw"] / "run_1"), "--out",
                 str(tmp_path / "p")]) == 0
    got = pv.read(tmp_path / "p" / "run_1" / "volume_1.vtu")
    assert all(f"{f}Pred" in got.cell_data for f in FIELDS)
