from __future__ import annotations

import json

import numpy as np
import pytest
import pyvista as pv

from meshshard.cli import main
from meshshard.partition import Partition
from tests.partition._pixels import shard_pixels


@pytest.fixture(scope="module")
def mesh_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    grid = pv.ImageData(dimensions=(11, 9, 7)).cast_to_unstructured_grid()
    grid.cell_data["work"] = np.where(grid.cell_centers().points[:, 0] < 3, 4.0, 1.0)
    grid.save(d / "grid.vtu")
    np.save(d / "cloud.npy", np.random.default_rng(0).random((400, 3)))
    return d


@pytest.mark.parametrize("method", ["hilbert", "morton", "rcb", "metis"])
def test_partition_writes_partition_and_metrics(mesh_file, tmp_path, capsys, method):
    out = tmp_path / "out"
    rc = main(["partition", str(mesh_file / "grid.vtu"), "--parts", "3", "--method", method,
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    part = Partition.load(out)
    assert part.nparts == 3 and part.num_points == 10 * 8 * 6 and part.method == method
    assert part.params["on"] == "cells" and part.params["input"].endswith("grid.vtu")
    m = json.loads((out / "metrics.json").read_text())
    assert m["sizes"] == part.sizes.tolist() and m["edge_cut"] > 0
    text = capsys.readouterr().out
    assert "edge cut:" in text and "communication volume:" in text and "contiguity:" in text


def test_partition_weights_targets_points_and_force(mesh_file, tmp_path, capsys):
    out = tmp_path / "o"
    args = ["partition", str(mesh_file / "grid.vtu"), "-p", "2", "-m", "rcb", "--weights",
            "work", "--targets", "0.25,0.75", "--out", str(out), "--json"]  # fmt: skip
    assert main(args) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["imbalance_weighted"] < 1.05
    assert m["loads"][1] == pytest.approx(3 * m["loads"][0], rel=0.05)
    assert main(args) == 2  # exists
    assert "already exists; pass --force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
    cloud = ["partition", str(mesh_file / "cloud.npy"), "-p", "4", "--out", str(tmp_path / "c")]
    assert main(cloud) == 0
    assert Partition.load(tmp_path / "c").params["on"] == "points"


def test_partition_metis_volume_objective(mesh_file, tmp_path, capsys):
    runs = {}
    for obj in ("cut", "vol"):
        out = tmp_path / obj
        argv = ["partition", str(mesh_file / "grid.vtu"), "-p", "4", "-m", "metis",
                "--objective", obj, "--out", str(out), "--json"]  # fmt: skip
        assert main(argv) == 0
        runs[obj] = json.loads(capsys.readouterr().out)
        part = Partition.load(out)
        assert part.params["objective"] == obj and part.sizes.sum() == 480
    assert runs["vol"]["comm_volume"] <= runs["cut"]["comm_volume"]
    out = tmp_path / "fm"
    argv = ["partition", str(mesh_file / "grid.vtu"), "-p", "4", "-m", "metis", "--objective",
            "vol", "--refine", "volume", "--tries", "2", "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    part = Partition.load(out)
    assert part.params["refine"] == "volume" and part.params["try_seeds"] == [0, 2]
    assert rep["comm_volume"] == min(part.params["try_volumes"]) <= runs["vol"]["comm_volume"]


@pytest.mark.parametrize(
    "argv,err",
    [
        (["-p", "0"], "--parts 0 must be >= 1"),
        (["-p", "2", "--targets", "0.5,0.6"], "targets must sum to 1"),
        (["-p", "2", "--targets", "a,b"], "comma-separated fractions"),
        (["-p", "2", "--weights", "nope"], "no cell field 'nope'"),
        (["-p", "2", "--on", "points", "--graph", "dual"], "use --graph knn"),
        (["-p", "2", "--objective", "vol"], "--objective is a METIS option; add --method metis"),
        (["-p", "2", "--refine", "volume"], "--refine is an option of the graph methods"),
        (["-p", "2", "-m", "metis", "--tries", "0"], "--tries 0 must be >= 1"),
    ],
)
def test_partition_user_errors_exit_2(mesh_file, tmp_path, capsys, argv, err):
    rc = main(["partition", str(mesh_file / "grid.vtu"), *argv, "--out", str(tmp_path / "x")])
    assert rc == 2
    assert err in capsys.readouterr().err


def test_partition_missing_and_truncated_input(mesh_file, tmp_path, capsys):
    missing = ["partition", str(tmp_path / "no.vtu"), "-p", "2", "--out", str(tmp_path / "z")]
    assert main(missing) == 2
    assert "no.vtu: no such file" in capsys.readouterr().err
    b = (mesh_file / "grid.vtu").read_bytes()
    (tmp_path / "cut.vtu").write_bytes(b[: len(b) // 3])
    cut = ["partition", str(tmp_path / "cut.vtu"), "-p", "2", "--out", str(tmp_path / "y")]
    assert main(cut) == 2
    assert "cut.vtu: unreadable or truncated" in capsys.readouterr().err


def test_inspect_directory_json_and_png(mesh_file, tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["partition", str(mesh_file / "grid.vtu"), "-p", "4", "-m", "metis",
                 "--out", str(out)]) == 0  # fmt: skip
    saved = json.loads((out / "metrics.json").read_text())
    capsys.readouterr()
    png = tmp_path / "shards.png"
    assert main(["inspect", str(out), "--json", "--png", str(png)]) == 0
    rep = json.loads(capsys.readouterr().out)
    for key in ("edge_cut", "comm_volume", "halo_volume", "imbalance", "components"):
        assert rep[key] == saved[key]
    counts = shard_pixels(png, 4)  # in the 3-D views only, not the size chart
    assert (counts > 500).all(), counts.tolist()  # every shard's colour is visible
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "most overweight part" in text and "neighbours per part: max" in text


def test_inspect_file_on_the_fly_and_errors(mesh_file, tmp_path, capsys):
    assert main(["inspect", str(mesh_file / "cloud.npy"), "-p", "3", "-m", "rcb"]) == 0
    assert "parts: 3  points: 400" in capsys.readouterr().out
    assert main(["inspect", str(mesh_file / "cloud.npy")]) == 2
    assert "pass --parts P" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path)]) == 2
    assert "(no partition.npz)" in capsys.readouterr().err  # not a Partition.save question


def test_inspect_zarr_store_reports_each_part(tmp_path, capsys):
    from meshshard.datasets.synthetic import make_synthetic_run

    make_synthetic_run(tmp_path / "src", 1, surface_cells=1500, volume_cells=0, seed=0)
    rc = main(["preprocess", "drivaerml", str(tmp_path / "src"), str(tmp_path / "out"),
               "--parts", "3", "--surface", "--no-progress"])  # fmt: skip
    assert rc == 0
    capsys.readouterr()
    store = tmp_path / "out" / "run_1.zarr"
    png = tmp_path / "store.png"
    assert main(["inspect", str(store), "--json", "--png", str(png)]) == 0
    rep = json.loads(capsys.readouterr().out)
    surf = rep["surface"]
    assert surf["parts"] == 3 and sum(surf["sizes"]) == rep["store"]["surface"]["rows"]
    assert surf["sizes"] == rep["store"]["surface"]["sharding_shapes"]
    assert surf["edge_cut"] > 0 and len(surf["halo_sizes"]) == 3
    assert png.is_file() and png.stat().st_size > 0
    assert main(["inspect", str(store)]) == 0
    text = capsys.readouterr().out
    assert "meshshard store report" in text and "edge cut:" in text and "[surface]" in text


def test_inspect_directory_with_input_override(mesh_file, tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["partition", str(mesh_file / "cloud.npy"), "-p", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--input", str(mesh_file / "cloud.npy"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_points"] == 400
    assert main(["inspect", str(out), "--input", str(mesh_file / "grid.vtu")]) == 2
    assert "has 400 rows; pass the matching --input/--on" in capsys.readouterr().err


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize(("method", "module", "preset"), [
    ("hypergraph", "mtkahypar", "deterministic"), ("kaminpar", "kaminpar", "strong")])
def test_partition_and_inspect_with_the_extra_graph_methods(mesh_file, tmp_path, capsys,
                                                            method, module, preset):
    """--method kaminpar / hypergraph from the CLI: the partition, its ghost rows, and the
    same cut again for the same seed; without the extra, a one-line error naming it."""
    argv = ["partition", str(mesh_file / "grid.vtu"), "-p", "3", "-m", method, "--json"]
    if not _have(module):
        assert main([*argv, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip()
        assert module in err and len(err.splitlines()) == 1
        return
    outs = []
    for k in range(2):
        out = tmp_path / f"p{k}"
        assert main([*argv, "--preset", preset, "--seed", "3", "--out", str(out)]) == 0
        m = json.loads(capsys.readouterr().out)
        assert m["sizes"] == Partition.load(out).sizes.tolist() and m["edge_cut"] > 0
        assert Partition.load(out).method == method
        outs.append(Partition.load(out).assignment)
    if method == "hypergraph":  # the deterministic preset is reproducible for a seed
        assert np.array_equal(outs[0], outs[1])
    assert main(["inspect", str(mesh_file / "grid.vtu"), "-p", "3", "-m", method, "--preset",
                 preset, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sizes"]


@pytest.mark.parametrize(("argv", "err"), [
    (["-m", "hypergraph", "--preset", "strong"], "choose one of deterministic"),
    (["-m", "kaminpar", "--preset", "quality"], "choose one of fast"),
    (["-m", "metis", "--preset", "strong"], "not metis"),
    (["-m", "rcb", "--preset", "strong"], "--preset is an option of --method kaminpar"),
    (["-m", "rcb", "--tries", "2"], "graph methods"),
])
def test_partition_preset_errors_exit_2(mesh_file, tmp_path, capsys, argv, err):
    rc = main(["partition", str(mesh_file / "grid.vtu"), "-p", "3", *argv, "--out",
               str(tmp_path / "x")])
    assert rc == 2
    assert err in capsys.readouterr().err
