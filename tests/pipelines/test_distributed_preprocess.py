"""`meshshard preprocess ... --distributed`: ranks repartition one run store together; the result
equals the single-process partition of the same rows, loads with load_shard, and a failing rank
publishes nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshshard.datasets import load_shard, make_synthetic_run
from meshshard.partition import partition
from meshshard.pipelines import preprocess_runs
from meshshard.store.format import open_store, verify_store
from meshshard.testing.distributed import run_ranks
from tests.pipelines._dist_preprocess_fns import cli_rank


@pytest.fixture(scope="module")
def source_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("distpre")
    make_synthetic_run(root / "raw", 1, surface_cells=2000, volume_cells=1000, seed=3)
    res = preprocess_runs(root / "raw", root / "stores", parts=2, method="morton", progress=False)
    assert [r.status for r in res] == ["written"]
    return root / "stores" / "run_1.zarr"


def _argv(src: Path, dst: Path, parts: int, method: str) -> list[str]:
    return ["preprocess", "drivaerml", str(src), str(dst), "--parts", str(parts),
            "--method", method, "--distributed", "--no-progress"]  # fmt: skip


@pytest.mark.parametrize(("world", "parts", "method"), [(2, 3, "hilbert"), (3, 3, "rcb")])
def test_distributed_store_equals_single_process(source_store, tmp_path, world, parts, method):
    dst = tmp_path / "out"
    got = run_ranks(cli_rank, world, _argv(source_store, dst, parts, method), timeout=240)
    assert got == [(0, "")] * world
    src_g, src_a = open_store(source_store)
    new_g, new_a = open_store(dst / "run_1.zarr")
    # every chunk each rank wrote is in the record, with the crc32 that rank computed
    assert verify_store(dst / "run_1.zarr")["arrays"] == len(new_a["arrays"])
    assert new_a["nparts"] == parts and new_a["request"]["distributed"] is True
    for part, keys in (
        ("surface", ["surface_mesh_centers", "surface_normals", "surface_areas",
                     "surface_fields", "surface_perm"]),
        ("volume", ["volume_mesh_centers", "volume_fields", "volume_perm"]),
    ):  # fmt: skip
        x = np.asarray(src_g[f"{part}_mesh_centers"][...])
        ref = partition(x, parts, method)
        assert new_a[part]["partition_ptr"] == ref.offsets.tolist()
        assert new_a[part]["method"] == method
        for k in keys:
            np.testing.assert_array_equal(new_g[k][...], ref.apply(np.asarray(src_g[k][...])))
    for k in ("stl_coordinates", "stl_faces"):
        np.testing.assert_array_equal(new_g[k][...], src_g[k][...])
    # loaders need no change
    rows = [load_shard(dst / "run_1.zarr", r, parts)["surface_mesh_centers"] for r in range(parts)]
    assert [len(r) for r in rows] == np.diff(new_a["surface"]["partition_ptr"]).tolist()
    # resumable: a second run finds the store up to date and leaves it alone
    stamp = (dst / "run_1.zarr" / "zarr.json").stat().st_mtime_ns
    again = run_ranks(cli_rank, world, _argv(source_store, dst, parts, method), timeout=240)
    assert again == [(0, "")] * world
    assert (dst / "run_1.zarr" / "zarr.json").stat().st_mtime_ns == stamp


def test_failing_rank_publishes_nothing(source_store, tmp_path):
    dst = tmp_path / "out"
    argv = _argv(source_store, dst, 2, "hilbert")
    got = run_ranks(cli_rank, 2, argv, {"phase": "write", "rank": 1}, timeout=240)
    for rc, text in got:  # the CLI's one-line error, exit status 1, on every rank
        assert rc == 1, got
        assert "failed on rank(s) [1]" in text and "nothing was published" in text
    assert not (dst / "run_1.zarr").exists()
    assert not list(dst.glob("run_1.zarr.tmp-*"))  # rank 0 removed its temporary store
    # a clean rerun writes it
    assert run_ranks(cli_rank, 2, argv, timeout=240) == [(0, "")] * 2
    assert open_store(dst / "run_1.zarr")[1]["complete"] is True


def test_surface_only_and_unsupported_flags(source_store, tmp_path):
    dst = tmp_path / "out"
    argv = [*_argv(source_store, dst, 2, "morton"), "--surface"]
    assert run_ranks(cli_rank, 2, argv, timeout=240) == [(0, "")] * 2
    g, attrs = open_store(dst / "run_1.zarr")
    assert attrs.get("volume") is None and "volume_fields" not in attrs["arrays"]
    assert (
        attrs["surface"]["sharding_shapes"]
        == partition(
            np.asarray(open_store(source_store)[0]["surface_mesh_centers"][...]), 2, "morton"
        ).sizes.tolist()
    )
    # options the distributed path does not implement are refused on every rank (exit 2)
    bad = [*_argv(source_store, tmp_path / "x", 2, "morton"), "--halo-radius", "0.1"]
    for rc, text in run_ranks(cli_rank, 2, bad, timeout=240):
        assert rc == 2 and "--halo-radius cannot be combined with --distributed" in text
    assert not (tmp_path / "x").exists()


def test_graph_is_refused_not_ignored(source_store, tmp_path):
    # --graph dual used to be dropped silently: the stores came out without graph shards
    bad = [*_argv(source_store, tmp_path / "g", 2, "morton"), "--graph", "dual"]
    for rc, text in run_ranks(cli_rank, 2, bad, timeout=240):
        assert rc == 2 and "--graph dual cannot be combined with --distributed" in text
        assert "no cell connectivity" in text and "without --distributed" in text
    assert not (tmp_path / "g").exists()  # refused before any work
