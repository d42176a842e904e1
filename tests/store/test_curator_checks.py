"""Curator stores carry no checksums: what a damaged or foreign one did silently (a deleted
chunk read as zeros, NaN truth, uint8 geometry, a declared shape far beyond its chunks) is now
a StoreError naming the store and the array, before the rows are used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from meshshard.datasets import load_shard, make_synthetic_run
from meshshard.datasets.curator import write_curator_store
from meshshard.store.format import StoreError


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("curator_checks")
    run = make_synthetic_run(root / "raw", index=4, surface_cells=1500, volume_cells=0)
    # small chunks: several per array, so one can go missing
    return write_curator_store(root / "run_4.zarr", run.run_dir, volume=False, chunk_bytes=8192)


@pytest.fixture
def copy(store, tmp_path) -> Path:
    dst = tmp_path / "run_4.zarr"
    shutil.copytree(store, dst)
    return dst


def _load(path: Path):
    return load_shard(path, 0, 1, keys=("surface_mesh_centers", "surface_normals",
                                        "surface_areas", "surface_fields"))


def _rewrite(path: Path, key: str, a: np.ndarray) -> None:
    """Array ``key`` replaced by ``a`` (its dtype), chunked as before."""
    import zarr

    g = zarr.open_group(str(path), mode="r+")
    chunks = g[key].chunks
    del g[key]
    g.create_array(key, shape=a.shape, dtype=a.dtype, chunks=chunks)
    g[key][...] = a


def test_the_store_loads(copy):
    got = _load(copy)
    assert got["surface_fields"].shape[0] == got["surface_mesh_centers"].shape[0] > 0
    assert np.isfinite(got["surface_fields"].numpy()).all()


def test_a_missing_chunk_is_an_error_not_zeros(copy):
    import zarr

    chunk = copy / "surface_fields" / "c" / "1" / "0"
    assert chunk.is_file()
    rows = zarr.open_array(str(copy / "surface_fields"), mode="r").chunks[0]
    chunk.unlink()
    # what zarr itself reads there: the fill value, a row of zeros for every missing row
    a = zarr.open_array(str(copy / "surface_fields"), mode="r")[rows:2 * rows]
    assert (a == 0).all()
    with pytest.raises(StoreError, match=r"array surface_fields: chunk 1\.0 \(rows from "
                       rf"{rows:,}\) is missing: it would read as zeros") as e:
        _load(copy)
    assert str(copy) in str(e.value) and "no checksums" in str(e.value)


def test_a_declared_shape_beyond_the_chunks_fails_before_reading(copy):
    """1e15 rows over a few chunk files: zarr filled zeros until MemoryError before."""
    f = copy / "surface_mesh_centers" / "zarr.json"
    meta = json.loads(f.read_text())
    meta["shape"][0] = 10**15
    f.write_text(json.dumps(meta))
    with pytest.raises(StoreError, match=r"surface_mesh_centers declares shape "
                       r"\(1000000000000000, 3\) in [\d,]+ chunk\(s\), but only \d+ chunk file"):
        _load(copy)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_truth_is_refused(copy, value):
    import zarr

    f = np.asarray(zarr.open_array(str(copy / "surface_fields"), mode="r")[...])
    f[17, 2] = value
    _rewrite(copy, "surface_fields", f)
    with pytest.raises(StoreError, match=r"array surface_fields has 1 row\(s\) with NaN or inf"):
        _load(copy)


@pytest.mark.parametrize(("key", "dtype"), [("surface_mesh_centers", np.uint8),
                                            ("surface_normals", np.int8)])
def test_integer_geometry_is_refused(copy, key, dtype):
    import zarr

    a = np.asarray(zarr.open_array(str(copy / key), mode="r")[...])
    _rewrite(copy, key, np.clip(a * 10, -100, 200).astype(dtype))
    with pytest.raises(StoreError, match=f"array {key} holds {np.dtype(dtype).name}; curator "
                       "writes geometry and fields as floating point"):
        _load(copy)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_undecodable_chunks_name_the_store_and_array(copy, damage):
    chunk = copy / "surface_normals" / "c" / "0" / "0"
    data = chunk.read_bytes()
    chunk.write_bytes(data[: len(data) // 3] if damage == "truncate"
                      else np.random.default_rng(0).bytes(len(data)))
    with pytest.raises(StoreError, match=r"array surface_normals: a chunk does not decode") \
            as e:
        _load(copy)
    assert str(copy) in str(e.value)


@pytest.mark.parametrize("attr", ["air_density", "stream_velocity"])
def test_absurd_flow_conditions_are_refused(copy, attr):
    """air_density 1e308 gave inf fields."""
    import zarr

    zarr.open_group(str(copy), mode="r+").attrs[attr] = 1e308
    with pytest.raises(StoreError, match=r"must lie in \[1e-06, 1e\+06\]"):
        _load(copy)


def test_non_finite_truth_on_one_rank_stops_every_rank(copy):
    """Rank 0's slice holds the NaN; rank 1 must not wait in the partitioner's collective."""
    import zarr

    from meshshard.testing.distributed import run_ranks
    from tests.datasets._curator_fns import refused_rank

    f = np.asarray(zarr.open_array(str(copy / "surface_fields"), mode="r")[...])
    f[3, 0] = np.nan
    _rewrite(copy, "surface_fields", f)
    out = run_ranks(refused_rank, 2, str(copy), timeout=120)
    assert out[0] != "" and out[1] == f"(rank 0) {out[0]}"  # rank 1 names the finder
    assert "array surface_fields has 1 row(s) with NaN or inf" in out[0]


def test_inspect_verify_checks_what_the_layout_allows(copy, capsys):
    from meshshard.cli import main

    assert main(["inspect", str(copy), "--verify", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["verified"]["arrays"]["surface_fields"]["chunks"] >= 2
    assert "none in this layout" in got["verified"]["checksums"]
    assert main(["inspect", str(copy)]) == 2  # no --verify: a pointer, not a wrong report
    assert "pass --verify" in capsys.readouterr().err
    import zarr

    zarr.open_array(str(copy / "surface_areas"), mode="r+")[7] = np.inf
    assert main(["inspect", str(copy), "--verify"]) == 2
    err = capsys.readouterr().err
    assert "array surface_areas has 1 row(s) with NaN or inf (first at row 7)" in err
    shutil.rmtree(copy / "surface_normals" / "c" / "1")
    assert main(["inspect", str(copy), "--verify"]) == 2
    assert "array surface_normals: chunk 1.0" in capsys.readouterr().err


_LOAD = """
import sys
from meshshard.datasets import load_shard
from meshshard.store.format import StoreError
try:
    load_shard(sys.argv[1], 0, 1)
except StoreError as exc:
    print("refused:", exc)
"""


def test_a_fifo_chunk_is_refused_in_bounded_time(copy):
    import os
    import subprocess
    import sys

    chunk = copy / "surface_areas" / "c" / "0"
    chunk.unlink()
    os.mkfifo(chunk)
    r = subprocess.run([sys.executable, "-c", _LOAD, str(copy)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-400:]
    assert "array surface_areas: chunk 0 (rows from 0) is not a regular file" in r.stdout, \
        r.stdout
