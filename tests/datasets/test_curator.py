"""physicsnemo-curator zarr stores: the generator writes curator's layout, and load_shard /
ShardedRunDataset read them on 2 and 3 ranks (uneven), each rank reading a slice, equal to a
single-process read and partition of the same rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshshard.datasets import load_shard, make_synthetic_run, read_run
from meshshard.datasets.curator import curator_info, is_curator_store, write_curator_store
from meshshard.partition import partition
from meshshard.store.format import StoreError
from meshshard.testing.distributed import run_ranks
from tests.datasets._curator_fns import load_rank


@pytest.fixture(scope="module")
def curator(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("curator")
    run = make_synthetic_run(root / "raw", index=3, surface_cells=1500, volume_cells=900)
    store = write_curator_store(root / "stores" / "run_3.zarr", run.run_dir)
    return store, run.run_dir


def test_layout_is_curators(curator):
    store, run_dir = curator
    import zarr

    g = zarr.open_group(str(store), mode="r")
    for k in ("stl_coordinates", "stl_centers", "stl_faces", "stl_areas", "surface_mesh_centers",
              "surface_normals", "surface_areas", "surface_fields", "volume_mesh_centers",
              "volume_fields", "global_params_values", "global_params_reference"):
        assert k in g, k
    meta = json.loads((store / "surface_fields" / "zarr.json").read_text())
    assert meta["codecs"][-1]["name"] == "blosc"
    assert meta["codecs"][-1]["configuration"]["cname"] == "zstd"
    assert is_curator_store(store)
    # raw units in the store, non-dimensional after curator_info's scales
    run = read_run(run_dir)
    _, info = curator_info(store)
    raw = np.asarray(g["surface_fields"][...])
    q = info["rho"] * info["u_inf"] ** 2
    np.testing.assert_allclose(raw[:, 0] / q, run.surface.fields[:, 0], rtol=1e-5, atol=1e-7)
    assert info["columns"]["surface"] == {"pMeanTrim": [0, 1], "wallShearStressMeanTrim": [1, 4]}


@pytest.mark.parametrize("world", [2, 3])
def test_curator_store_loads_on_ranks(curator, world):
    store, run_dir = curator
    out = run_ranks(load_rank, world, str(store), str(store.parent), timeout=240)
    one = load_shard(store, 0, 1, part="surface", keys=("surface_mesh_centers", "surface_fields",
                                                         "surface_perm"))
    import zarr

    g = zarr.open_group(str(store), mode="r")
    pts = np.asarray(g["surface_mesh_centers"][...])
    ref = partition(pts, world, "hilbert")
    _, info = curator_info(store)
    fields = np.asarray(g["surface_fields"][...]) / (info["rho"] * info["u_inf"] ** 2)
    sizes = [o["plain"]["surface_perm"].shape[0] for o in out]
    assert sizes == np.diff(ref.offsets).tolist() == out[0]["st_sizes"]
    perm = np.concatenate([o["plain"]["surface_perm"] for o in out])
    np.testing.assert_array_equal(perm, ref.order)
    got = np.concatenate([o["plain"]["surface_mesh_centers"] for o in out])
    np.testing.assert_array_equal(got, pts[ref.order])
    gf = np.concatenate([o["plain"]["surface_fields"] for o in out])
    np.testing.assert_allclose(gf, fields[ref.order].astype(np.float32), rtol=1e-6)
    # the same rows as one process reads, in another (partition) order
    np.testing.assert_array_equal(gf[np.argsort(perm)],
                                  one["surface_fields"].numpy()[np.argsort(one["surface_perm"])])
    for o in out:
        np.testing.assert_array_equal(o["st_local"], o["plain"]["surface_fields"])
        np.testing.assert_array_equal(o["ds_perm"], o["plain"]["surface_perm"])
        assert o["stl"][1] == 3
    # each rank read only its slice of every part array: rows [N r / W, N (r + 1) / W)
    n = pts.shape[0]
    nv = g["volume_fields"].shape[0]
    for r, o in enumerate(out):
        assert o["reads"], "no reads recorded"
        for name, sel in o["reads"]:
            rows = nv if name.startswith("volume_") else n
            assert sel == (rows * r // world, rows * (r + 1) // world), (name, sel)
    vol = np.concatenate([o["vol"] for o in out])
    assert vol.shape == (g["volume_fields"].shape[0], 5)


def test_bad_curator_stores(curator, tmp_path):
    store, run_dir = curator
    import shutil

    bad = tmp_path / "run_9.zarr"
    shutil.copytree(store, bad)
    shutil.rmtree(bad / "surface_normals")
    with pytest.raises(StoreError, match="no surface_normals"):
        load_shard(bad, 0, 1)
    assert not is_curator_store(tmp_path)
