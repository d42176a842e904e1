from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import pyvista as pv
import zarr

from meshshard.cli import main
from meshshard.datasets import load_halo, load_shard, read_run
from meshshard.partition import HaloPlan, Partition
from meshshard.pipelines import preprocess_runs, process_run
from meshshard.store import StoreError, inspect_store
from meshshard.store.format import CRASH_ENV, open_store, write_store
from meshshard.testing.distributed import run_ranks
from tests.pipelines._fns import load_local, stack

U = 38.889


@pytest.fixture(scope="module")
def stores(runs_src, tmp_path_factory):
    out = tmp_path_factory.mktemp("stores")
    res = preprocess_runs(runs_src, out, parts=4, halo_radius=0.3)
    assert [r.status for r in res] == ["written", "written"]
    return out


def _arrays(store: Path) -> dict:
    g = zarr.open_group(str(store), mode="r")
    return {k: np.asarray(a[...]) for k, a in g.arrays()}


def _attrs(store: Path) -> dict:
    return dict(zarr.open_group(str(store), mode="r").attrs)


def test_two_ranks_read_back_the_source_arrays(stores, runs_src):
    store = stores / "run_1.zarr"
    for part in ("surface", "volume"):
        res = run_ranks(load_local, 2, str(store), part)
        sizes = [int(r["sharding_sizes"][0]) for r in res]
        assert res[0]["sharding_sizes"].tolist() == res[1]["sharding_sizes"].tolist()
        assert [r[f"{part}_perm"].shape[0] for r in res] == res[0]["sharding_sizes"].tolist()
        perm = stack(res, f"{part}_perm")
        assert sorted(perm.tolist()) == list(range(perm.size))
        assert sizes[0] >= 0
        if part == "surface":
            src = pv.read(runs_src / "run_1" / "boundary_1.vtp")
            f = stack(res, "surface_fields")
            np.testing.assert_allclose(f[:, 0], src.cell_data["pMeanTrim"][perm] / U**2, rtol=1e-6)
            np.testing.assert_allclose(
                f[:, 1:4], src.cell_data["wallShearStressMeanTrim"][perm] / U**2, rtol=1e-6
            )
            np.testing.assert_allclose(
                stack(res, "surface_mesh_centers"), src.cell_centers().points[perm], atol=1e-6
            )
            np.testing.assert_allclose(
                stack(res, "surface_areas"), src.compute_cell_sizes()["Area"][perm], rtol=1e-5
            )
        else:
            src = pv.read(runs_src / "run_1" / "volume_1.vtu")
            f = stack(res, "volume_fields")
            np.testing.assert_allclose(f[:, :3], src.cell_data["UMeanTrim"][perm] / U, rtol=1e-6)
            np.testing.assert_allclose(
                stack(res, "volume_mesh_centers"), src.cell_centers().points[perm], atol=2e-6
            )


def test_sharding_shapes_partition_ptr_and_chunks(stores):
    attrs = _attrs(stores / "run_1.zarr")
    a = attrs["surface"]
    assert attrs["schema_version"] == 1 and attrs["complete"] and attrs["nparts"] == 4
    assert a["partition_ptr"] == np.concatenate([[0], np.cumsum(a["sharding_shapes"])]).tolist()
    g = zarr.open_group(str(stores / "run_1.zarr"), mode="r")
    chunk = g["surface_mesh_centers"].chunks[0]
    assert chunk == a["chunk"]
    if a["chunk_aligned"]:
        assert all(o % chunk == 0 for o in a["partition_ptr"])
    loads = [load_shard(stores / "run_1.zarr", r, 4)["surface_fields"].shape[0] for r in range(4)]
    assert loads == a["sharding_shapes"]
    merged = [load_shard(stores / "run_1.zarr", r, 2)["sharding_sizes"].tolist() for r in range(2)]
    s = a["sharding_shapes"]
    assert merged[0] == merged[1] == [s[0] + s[1], s[2] + s[3]]


def test_world_size_that_does_not_divide_nparts(stores):
    with pytest.raises(
        ValueError, match=r"stored with 4 parts, which 3 ranks cannot share.*--parts 3"
    ):
        load_shard(stores / "run_1.zarr", 0, 3)


def test_uneven_layouts_including_empty_shards(runs_src, tmp_path):
    data = read_run(runs_src / "run_2", volume=False)
    n = data.surface.centers.shape[0]
    for sizes in ([0, n], [3, n - 3], [1, 1, n - 2, 0]):
        assignment = np.repeat(np.arange(len(sizes)), sizes)
        rng = np.random.default_rng(len(sizes))
        part = Partition.from_assignment(rng.permutation(assignment), len(sizes), method="test")
        store = tmp_path / f"u{len(sizes)}{sizes[0]}" / "run_2.zarr"
        store.parent.mkdir()
        write_store(store, data, {"surface": part}, {}, request={}, dataset={})
        got = [load_shard(store, r, len(sizes)) for r in range(len(sizes))]
        assert [g["surface_fields"].shape[0] for g in got] == sizes
        perm = np.concatenate(
            [
                load_shard(store, r, len(sizes), keys=["surface_perm"])["surface_perm"]
                for r in range(len(sizes))
            ]
        )
        np.testing.assert_array_equal(perm, part.order)
        full = np.concatenate([g["surface_fields"].numpy() for g in got])
        np.testing.assert_array_equal(full, data.surface.fields[part.order])


def test_sharded_tensors_on_a_device_mesh(runs_src, tmp_path):
    from tests.pipelines._fns import load_sharded

    data = read_run(runs_src / "run_2", volume=False)
    n = data.surface.centers.shape[0]
    part = Partition.from_assignment(np.repeat([0, 1], [0, n]), 2, method="test")
    store = tmp_path / "run_2.zarr"
    write_store(store, data, {"surface": part}, {}, request={}, dataset={})
    res = run_ranks(load_sharded, 2, str(store))
    assert res[0]["sizes"] == res[1]["sizes"] == (0, n)
    np.testing.assert_array_equal(res[0]["surface_fields"], data.surface.fields[part.order])
    assert res[0]["dataset_len"] == 1 and res[1]["local_rows"] == n


def test_halo_routing_is_stored(stores):
    attrs = _attrs(stores / "run_1.zarr")
    plan_parts = [load_halo(stores / "run_1.zarr", r) for r in range(4)]
    plan = HaloPlan(
        offsets=np.asarray(attrs["surface"]["partition_ptr"]),
        send_ptr=tuple(p["send_ptr"] for p in plan_parts),
        send_idx=tuple(p["send_idx"] for p in plan_parts),
        recv_ptr=tuple(p["recv_ptr"] for p in plan_parts),
        recv_idx=tuple(p["recv_idx"] for p in plan_parts),
    )
    plan.validate()
    assert plan.halo_sizes().tolist() == attrs["surface"]["halo"]["halo_sizes"]
    assert plan.halo_sizes().sum() > 0
    # every received ghost really lies within the radius of some local row
    centres = np.concatenate(
        [load_shard(stores / "run_1.zarr", r, 4)["surface_mesh_centers"] for r in range(4)]
    )
    off = attrs["surface"]["partition_ptr"]
    from scipy.spatial import cKDTree

    for p in range(4):
        ghosts = centres[plan.recv_idx[p]]
        if ghosts.size:
            d, _ = cKDTree(centres[off[p] : off[p + 1]]).query(ghosts)
            assert d.max() <= 0.3 + 1e-6


def test_rerun_skips_verified_stores_and_redoes_changed_ones(runs_src, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(runs_src, src)
    out = tmp_path / "out"
    assert [r.status for r in preprocess_runs(src, out, parts=2)] == ["written", "written"]
    before = (out / "run_1.zarr" / "zarr.json").stat().st_mtime_ns
    assert [r.status for r in preprocess_runs(src, out, parts=2)] == ["skipped", "skipped"]
    assert (out / "run_1.zarr" / "zarr.json").stat().st_mtime_ns == before
    # a changed source file is noticed (fingerprint), the store rewritten with the new values
    mesh = pv.read(src / "run_1" / "boundary_1.vtp")
    mesh.cell_data["pMeanTrim"] = mesh.cell_data["pMeanTrim"] * 2
    mesh.save(src / "run_1" / "boundary_1.vtp")
    res = preprocess_runs(src, out, parts=2)
    assert [r.status for r in res] == ["written", "skipped"]
    perm = _arrays(out / "run_1.zarr")["surface_perm"]
    f = _arrays(out / "run_1.zarr")["surface_fields"]
    np.testing.assert_allclose(f[:, 0], mesh.cell_data["pMeanTrim"][perm] / U**2, rtol=1e-6)
    # an incomplete store (array removed) is redone, not trusted
    shutil.rmtree(out / "run_2.zarr" / "surface_normals")
    with pytest.raises(StoreError, match=r"array 'surface_normals' missing or corrupt"):
        load_shard(out / "run_2.zarr", 0, 2)
    assert [r.status for r in preprocess_runs(src, out, parts=2)] == ["skipped", "written"]
    # other options: refused without overwrite, replaced with it
    res = preprocess_runs(src, out, parts=4, runs=["run_1"])
    assert res[0].status == "failed" and "parts 2 -> 4" in res[0].message
    assert "--overwrite" in res[0].message
    res = preprocess_runs(src, out, parts=4, runs=["run_1"], overwrite=True)
    assert res[0].status == "written" and _attrs(out / "run_1.zarr")["nparts"] == 4
    assert sorted(p.name for p in out.iterdir()) == ["run_1.zarr", "run_2.zarr"]


def test_newer_schema_version_is_refused(runs_src, tmp_path):
    out = tmp_path / "out"
    process_run(runs_src / "run_2", out, parts=2)
    meta = out / "run_2.zarr" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["schema_version"] = 99
    meta.write_text(json.dumps(doc))
    with pytest.raises(
        StoreError, match=r"run_2\.zarr: schema_version=99 is newer.*upgrade meshshard"
    ):
        load_shard(out / "run_2.zarr", 0, 2)
    with pytest.raises(StoreError, match="newer"):
        process_run(runs_src / "run_2", out, parts=2)
    with pytest.raises(StoreError, match="newer"):
        inspect_store(out / "run_2.zarr")
    process_run(runs_src / "run_2", out, parts=2, overwrite=True)  # explicit overwrite works
    assert _attrs(out / "run_2.zarr")["schema_version"] == 1


def test_older_schema_version_is_refused_and_left_alone(runs_src, tmp_path):
    out = tmp_path / "out"
    process_run(runs_src / "run_2", out, parts=2)
    meta = out / "run_2.zarr" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["schema_version"] = 0
    meta.write_text(json.dumps(doc))
    before = meta.read_bytes()
    with pytest.raises(StoreError, match=r"run_2\.zarr: schema_version=0 .*older.*--overwrite"):
        load_shard(out / "run_2.zarr", 0, 2)
    with pytest.raises(StoreError, match="older"):
        process_run(runs_src / "run_2", out, parts=2)
    assert meta.read_bytes() == before  # nothing overwritten without --overwrite
    process_run(runs_src / "run_2", out, parts=2, overwrite=True)
    assert _attrs(out / "run_2.zarr")["schema_version"] == 1


def test_paths_that_escape_dst_are_refused(runs_src, tmp_path):
    for bad in ("../run_1", "..", "a/b", ""):
        with pytest.raises(ValueError, match="would escape"):
            preprocess_runs(runs_src, tmp_path / "out", parts=2, runs=[bad])
    assert not (tmp_path / "out").exists()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "run_2").symlink_to(runs_src / "run_2", target_is_directory=True)
    res = preprocess_runs(linked, tmp_path / "out", parts=2, volume=False)
    assert [r.status for r in res] == ["written"]  # symlinked run directories are fine


def _cli(args: list[str], env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    cmd = [sys.executable, "-m", "meshshard", "preprocess", "drivaerml", *args, "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_killed_mid_write_leaves_no_store_and_rerun_is_identical(runs_src, tmp_path):
    out, ref = tmp_path / "out", tmp_path / "ref"
    args = ["--parts", "2", "--halo-radius", "0.3", "--runs", "run_1"]
    crashed = _cli([str(runs_src), str(out), *args], {CRASH_ENV: "4"})
    # the worker died mid-write (os._exit(86)); the parent reports it and removes its temporary
    assert crashed.returncode == 1, crashed.stderr
    assert "run_1: the worker process" in crashed.stderr
    assert "exited with status 86" in crashed.stderr
    assert not out.exists()  # it made out, nothing was written: no empty directory left
    with pytest.raises(FileNotFoundError):
        load_shard(out / "run_1.zarr", 0, 2)
    # a temporary left by a writer that died with its parent is removed by the rerun
    (out / "run_1.zarr.tmp-999999999").mkdir(parents=True)
    (out / "run_1.zarr.tmp-999999999" / "zarr.json").write_text("{}")
    again = _cli([str(runs_src), str(out), *args])
    assert again.returncode == 0, again.stderr
    assert "1 written" in again.stdout
    assert sorted(p.name for p in out.iterdir()) == ["run_1.zarr"]  # temporary removed
    assert _cli([str(runs_src), str(ref), *args]).returncode == 0
    a, b = _arrays(out / "run_1.zarr"), _arrays(ref / "run_1.zarr")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert _attrs(out / "run_1.zarr") == _attrs(ref / "run_1.zarr")


def test_workers_and_rank_striding_give_the_same_stores(runs_src, tmp_path):
    one = preprocess_runs(runs_src, tmp_path / "one", parts=2, volume=False)
    two = preprocess_runs(runs_src, tmp_path / "two", parts=2, volume=False, workers=2)
    assert [r.status for r in one] == [r.status for r in two] == ["written", "written"]
    for run in ("run_1", "run_2"):
        a, b = _arrays(tmp_path / "one" / f"{run}.zarr"), _arrays(tmp_path / "two" / f"{run}.zarr")
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    r1 = preprocess_runs(runs_src, tmp_path / "ranks", parts=2, volume=False, rank=1, world_size=2)
    assert [r.run for r in r1] == ["run_2"]
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "2"
    try:
        r0 = preprocess_runs(runs_src, tmp_path / "ranks", parts=2, volume=False)
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]
    assert [r.run for r in r0] == ["run_1"]


def test_cli_and_inspect(runs_src, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "preprocess",
            "drivaerml",
            str(runs_src),
            str(out),
            "--parts",
            "2",
            "--surface",
            "--no-progress",
        ]
    )
    assert rc == 0
    assert "2 written" in capsys.readouterr().out
    info = inspect_store(out / "run_1.zarr")
    assert info["nparts"] == 2 and "volume" not in info
    assert sum(info["surface"]["sharding_shapes"]) == info["surface"]["rows"]
    assert info["surface"]["balance"] >= 1.0
    with pytest.raises(StoreError, match="has no volume part; preprocess it with --volume"):
        load_shard(out / "run_1.zarr", 0, 2, part="volume")
    # a surface-only store keeps no STL (a surface model reads none); --stl mesh keeps the
    # triangles DoMINO reads, without the centres and areas
    with pytest.raises(StoreError, match="no array 'stl_faces'"):
        load_shard(out / "run_1.zarr", 0, 2, part="stl", keys=("stl_faces",))
    assert main(["preprocess", "drivaerml", str(runs_src), str(tmp_path / "mesh"), "--parts",
                 "2", "--surface", "--stl", "mesh", "--no-progress"]) == 0  # fmt: skip
    _, attrs = open_store(tmp_path / "mesh" / "run_1.zarr")
    assert sorted(k for k in attrs["arrays"] if k.startswith("stl_")) == [
        "stl_coordinates", "stl_faces"]
    assert attrs["request"]["stl"] == "mesh"
    stl = load_shard(tmp_path / "mesh" / "run_1.zarr", 0, 2, part="stl",
                     keys=("stl_coordinates", "stl_faces"))  # fmt: skip
    assert stl["stl_faces"].shape[1] == 3
    assert main(["preprocess", "drivaerml", str(tmp_path / "nope"), str(out), "--parts", "2"]) == 2
    assert main(["preprocess", "drivaerml", str(runs_src), str(out), "--parts", "0"]) == 2
    assert "parts=0 must be an integer >= 1" in capsys.readouterr().err
    broken = tmp_path / "broken"
    shutil.copytree(runs_src / "run_2", broken / "run_2")
    (broken / "run_2" / "boundary_2.vtp").unlink()
    assert (
        main(["preprocess", "drivaerml", str(broken), str(out), "--parts", "2", "--no-progress"])
        == 1
    )
    assert "boundary_2.vtp: missing surface file" in capsys.readouterr().err


def test_choose_chunk():
    from meshshard.store.format import choose_chunk

    assert choose_chunk(np.array([0, 4096, 8192, 16384]), 16384) == (4096, True)
    assert choose_chunk(np.array([0, 1 << 20, 1 << 21]), 1 << 21) == (1 << 17, True)
    # offsets sharing only tiny divisors must not give tiny chunks (8.8M rows, gcd 2)
    assert choose_chunk(np.array([0, 1100016, 2200030, 8800122]), 8800122) == (1 << 17, False)
    assert choose_chunk(np.array([0, 750, 1500, 2250, 3000]), 3000) == (750, True)
    assert choose_chunk(np.array([0, 0, 10]), 10) == (10, True)


@pytest.mark.parametrize("method", ["hilbert", "rcb", "metis"])
def test_stored_partition_is_the_partitioners(runs_src, tmp_path, method):
    from meshshard.partition import partition
    from meshshard.store.format import store_partition

    process_run(runs_src / "run_2", tmp_path, parts=3, method=method, volume=False)
    data = read_run(runs_src / "run_2", volume=False)
    want = partition(data.surface.centers, 3, method=method)
    got, points = store_partition(tmp_path / "run_2.zarr")
    assert got == want and got.method == method
    np.testing.assert_array_equal(points, data.surface.centers)
    perm = _arrays(tmp_path / "run_2.zarr")["surface_perm"]
    np.testing.assert_array_equal(perm, want.order)


def test_a_failed_write_removes_its_temporary(runs_src, tmp_path, monkeypatch):
    import meshshard.pipelines.preprocess as pre

    def boom(path, *args, **kwargs):
        Path(path).mkdir()
        (Path(path) / "partial").write_text("x")
        raise OSError("disk full")

    monkeypatch.setattr(pre, "write_store", boom)
    with pytest.raises(OSError, match="disk full"):
        process_run(runs_src / "run_2", tmp_path, parts=2, volume=False)
    assert list(tmp_path.iterdir()) == []
