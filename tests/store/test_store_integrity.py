"""Damaged stores (issue 10, item 4 and the zarr part of item 7): a store missing or holding a
damaged chunk never passes verification, is never loaded silently, and a preprocess rerun
rewrites it; edited attributes are refused on every load path, with and without a mesh."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from meshshard.cli import main
from meshshard.datasets import load_shard
from meshshard.pipelines import process_run
from meshshard.store import StoreError, open_store
from meshshard.store.format import store_partition, verify_store
from meshshard.testing.distributed import run_ranks
from tests.pipelines._fns import load_sharded_error


@pytest.fixture(scope="module")
def good(runs_src, tmp_path_factory):
    """One finished store (surface and volume, 4 parts); copy it before damaging it."""
    out = tmp_path_factory.mktemp("good")
    res = process_run(runs_src / "run_1", out, parts=4)
    assert res.status == "written"
    return out / "run_1.zarr"


@pytest.fixture
def store(good, tmp_path):
    dst = tmp_path / "stores" / "run_1.zarr"
    shutil.copytree(good, dst)
    return dst


def _arrays(path: Path) -> dict:
    g = zarr.open_group(str(path), mode="r")
    return {k: np.asarray(a[...]) for k, a in g.arrays()}


def _chunks(path: Path, name: str) -> list[Path]:
    return sorted(p for p in (path / name / "c").rglob("*") if p.is_file())


def _edit_attrs(path: Path, **changes) -> None:
    meta = path / "zarr.json"
    doc = json.loads(meta.read_text())
    for key, value in changes.items():
        node = doc["attributes"]
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    meta.write_text(json.dumps(doc))


def test_a_finished_store_records_and_verifies_its_chunks(good):
    _, attrs = open_store(good)
    rec = attrs["integrity"]
    assert rec["algorithm"] == "crc32" and set(rec["arrays"]) == set(attrs["arrays"])
    n = sum(len(_chunks(good, k)) for k in attrs["arrays"])
    got = verify_store(good)
    assert got["chunk_files"] == n > len(attrs["arrays"]) and got["checksums"]
    assert got["bytes"] == sum(p.stat().st_size for k in attrs["arrays"] for p in _chunks(good, k))


def test_a_deleted_chunk_is_found_and_a_rerun_repairs_it(store, runs_src):
    want = _arrays(store)
    victim = _chunks(store, "surface_fields")[1]
    victim.unlink()
    rel = f"surface_fields/{victim.relative_to(store / 'surface_fields').as_posix()}"
    with pytest.raises(StoreError, match=rf"run_1\.zarr: array 'surface_fields': chunk file "
                       rf"{rel} is missing \(1 of \d+ missing\)"):  # fmt: skip
        open_store(store)
    for rank in range(4):  # every rank refuses it, not only the one whose rows are gone
        with pytest.raises(StoreError, match="is missing"):
            load_shard(store, rank, 4)
    with pytest.raises(StoreError, match="is missing"):
        verify_store(store)
    res = process_run(runs_src / "run_1", store.parent, parts=4)
    assert res.status == "written"  # not "skipped" as up to date
    verify_store(store)
    got = _arrays(store)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert process_run(runs_src / "run_1", store.parent, parts=4).status == "skipped"


@pytest.mark.parametrize("damage", ["truncate", "extra"])
def test_truncated_or_extra_chunk_files_fail_the_cheap_check(store, runs_src, damage):
    chunk = _chunks(store, "volume_mesh_centers")[0]
    if damage == "truncate":
        chunk.write_bytes(chunk.read_bytes()[:-7])
        match = "has .* bytes, recorded"
    else:
        shutil.copy(chunk, chunk.parent / "99")
        match = "unexpected chunk file"
    with pytest.raises(StoreError, match=match):
        load_shard(store, 0, 2, part="volume")
    assert process_run(runs_src / "run_1", store.parent, parts=4).status == "written"
    verify_store(store)


def test_a_flipped_byte_fails_verification_and_names_the_array_on_load(store, capsys):
    chunk = _chunks(store, "surface_mesh_centers")[0]
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    raw[0:16] = bytes(16)  # and the blosc header: the chunk no longer decodes
    chunk.write_bytes(bytes(raw))
    open_store(store)  # the cheap check sees the same files with the same sizes ...
    with pytest.raises(StoreError, match=r"surface_mesh_centers/.*crc32 differs"):
        verify_store(store)  # ... the full check does not
    assert main(["inspect", str(store), "--verify"]) == 2
    err = capsys.readouterr().err
    assert "crc32 differs" in err and "run_1.zarr" in err
    with pytest.raises(StoreError, match=r"run_1\.zarr: array 'surface_mesh_centers' cannot be "
                       r"read \(RuntimeError: error during blosc decompression"):  # fmt: skip
        for rank in range(4):
            load_shard(store, rank, 4)
    with pytest.raises(StoreError, match="surface_mesh_centers' cannot be read"):
        store_partition(store, "surface")


def test_inspect_verify_reports_a_good_store(good, capsys):
    assert main(["inspect", str(good), "--verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["store"]["verified"]["checksums"] is True
    assert out["store"]["verified"]["chunk_files"] > 0


def test_inspect_verify_says_its_verdict_first_and_last(good, capsys):
    """The report runs to ~100 lines: the verdict is the second line and the last one, not
    buried in the store's tree."""
    assert main(["inspect", str(good), "--verify", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"VERIFIED OK ({good.name}): ") and "checksum" in lines[1]
    assert lines[-1] == lines[1] and len(lines) > 20
    assert not any(line.strip() == "verified:" for line in lines)


PTR_EDITS = {
    "past_end": lambda p: p[:-1] + [p[-1] + 5],
    "out_of_order": lambda p: [p[0], p[2], p[1]] + p[3:],
    "short": lambda p: p[:-1],
    "not_zero": lambda p: [1] + p[1:],
    "floats": lambda p: [float(v) for v in p],
}


@pytest.mark.parametrize("edit", sorted(PTR_EDITS))
def test_edited_partition_ptr_is_refused_without_a_mesh(store, edit):
    ptr = open_store(store)[1]["surface"]["partition_ptr"]
    _edit_attrs(store, **{"surface.partition_ptr": PTR_EDITS[edit](ptr)})
    with pytest.raises(StoreError, match=r"run_1\.zarr: surface: partition_ptr"):
        load_shard(store, 0, 1)
    with pytest.raises(StoreError, match="partition_ptr"):
        load_shard(store, 1, 2, part="volume")  # any part: the store is damaged


def test_edited_partition_ptr_is_refused_with_a_mesh(store):
    ptr = open_store(store)[1]["surface"]["partition_ptr"]
    _edit_attrs(store, **{"surface.partition_ptr": PTR_EDITS["past_end"](ptr)})
    msgs = run_ranks(load_sharded_error, 2, str(store))
    assert all("partition_ptr" in m and "run_1.zarr" in m for m in msgs), msgs


@pytest.mark.parametrize("version", ["1", 1.0, True, [1]])
def test_schema_version_must_be_an_int(store, runs_src, version):
    _edit_attrs(store, schema_version=version)
    with pytest.raises(StoreError, match=r"schema_version=.* is not an integer"):
        load_shard(store, 0, 1)
    assert process_run(runs_src / "run_1", store.parent, parts=4).status == "written"


def test_array_rows_must_match_the_partition(store):
    _, attrs = open_store(store)
    shapes = attrs["arrays"]
    shapes["surface_areas"] = [shapes["surface_areas"][0] - 1]
    _edit_attrs(store, arrays=shapes)
    with pytest.raises(StoreError, match="array 'surface_areas' has shape"):
        load_shard(store, 0, 1)


def test_a_store_without_an_integrity_record_is_rewritten(store, runs_src):
    doc = json.loads((store / "zarr.json").read_text())
    del doc["attributes"]["integrity"]
    (store / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="no integrity record"):
        open_store(store)
    assert process_run(runs_src / "run_1", store.parent, parts=4).status == "written"
    verify_store(store)
