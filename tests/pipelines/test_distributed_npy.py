"""`preprocess --distributed` on a raw point set (.npy): each rank memory-maps the file and reads
only its row range (uneven and empty ranges included); the store equals the single-process
partition of the same points, is atomic and resumable, and loads with load_shard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshshard.datasets import load_shard
from meshshard.partition import partition
from meshshard.store.format import open_store, verify_store
from meshshard.testing.distributed import run_ranks
from tests.pipelines._dist_preprocess_fns import cli_rank, repartition_rank

N = 1000


@pytest.fixture(scope="module")
def cloud(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("npy")
    rng = np.random.default_rng(5)
    pts = rng.random((N, 3)).astype(np.float32)
    pts[100:300] = pts[7]  # duplicates: ties broken by row
    np.save(root / "cloud.npy", pts)
    np.save(root / "cloud.fields.npy", rng.standard_normal((N, 2)).astype(np.float32))
    return root / "cloud.npy"


def _check(store: Path, src: Path, parts: int, method: str) -> None:
    pts = np.load(src)
    fields = np.load(src.with_name("cloud.fields.npy"))
    ref = partition(pts, parts, method)
    g, attrs = open_store(store)
    assert verify_store(store)["arrays"] == len(attrs["arrays"]) == 3
    assert attrs["volume"]["partition_ptr"] == ref.offsets.tolist()
    np.testing.assert_array_equal(g["volume_mesh_centers"][...], ref.apply(pts))
    np.testing.assert_array_equal(g["volume_fields"][...], ref.apply(fields))
    np.testing.assert_array_equal(g["volume_perm"][...], ref.order)
    got = [load_shard(store, r, parts, part="volume")["volume_mesh_centers"] for r in range(parts)]
    np.testing.assert_array_equal(np.concatenate([t.numpy() for t in got]), ref.apply(pts))


@pytest.mark.parametrize(
    ("world", "parts", "method", "bounds"),
    [
        (2, 3, "hilbert", [0, 130, N]),  # uneven
        (3, 3, "rcb", [0, 0, 700, N]),  # rank 0 reads nothing
        (3, 4, "morton", [0, 400, 400, N]),  # rank 1 reads nothing
    ],
)
def test_npy_slices_equal_single_process(cloud, tmp_path, world, parts, method, bounds):
    dst = tmp_path / "out"
    splits = {"volume": bounds}
    got = run_ranks(repartition_rank, world, cloud, dst, parts, method, splits, timeout=240)
    assert got == [("written", "")] * world, got
    _check(dst / "cloud.zarr", cloud, parts, method)
    # resumable: up to date, left alone
    stamp = (dst / "cloud.zarr" / "zarr.json").stat().st_mtime_ns
    again = run_ranks(repartition_rank, world, cloud, dst, parts, method, splits, timeout=240)
    assert again == [("skipped", "")] * world
    assert (dst / "cloud.zarr" / "zarr.json").stat().st_mtime_ns == stamp


def test_npy_cli_and_failing_rank(cloud, tmp_path):
    dst = tmp_path / "out"
    argv = ["preprocess", "drivaerml", str(cloud), str(dst), "--parts", "2", "--method",
            "hilbert", "--distributed", "--no-progress"]  # fmt: skip
    got = run_ranks(cli_rank, 2, argv, {"phase": "write", "rank": 0}, timeout=240)
    for rc, text in got:
        assert rc == 1 and "failed on rank(s) [0]" in text, got
    assert not (dst / "cloud.zarr").exists() and not list(dst.glob("cloud.zarr.tmp-*"))
    assert run_ranks(cli_rank, 2, argv, timeout=240) == [(0, "")] * 2
    _check(dst / "cloud.zarr", cloud, 2, "hilbert")


def test_bad_npy_and_bad_splits(tmp_path):
    bad = tmp_path / "flat.npy"
    np.save(bad, np.zeros((10, 4), dtype=np.float32))
    for status, text in run_ranks(repartition_rank, 2, bad, tmp_path / "o", 2, "hilbert",
                                  timeout=120):  # fmt: skip
        assert status == "DistributedError" and "(N, 3) or (N, 2)" in text
    ok = tmp_path / "ok.npy"
    np.save(ok, np.random.default_rng(0).random((50, 3)))
    splits = {"volume": [0, 60, 50]}
    for status, text in run_ranks(repartition_rank, 2, ok, tmp_path / "o", 2, "hilbert", splits,
                                  timeout=120):  # fmt: skip
        assert status == "ValueError" and "non-decreasing rows from 0 to 50" in text
