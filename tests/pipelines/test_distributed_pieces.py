"""`preprocess --distributed` on a VTK XML mesh with several pieces (.vtp surface, .vtu volume):
each rank decodes only its whole pieces; the store equals the single-process partition of the
single-piece file's cells (uneven and empty pieces, a rank without pieces)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from meshshard.datasets import make_synthetic_run
from meshshard.datasets.drivaerml import read_surface, read_volume
from meshshard.datasets.schema import DRIVAERML
from meshshard.io.stl import read_stl
from meshshard.io.vtkxml import UnsupportedVtkXml, VtkXmlFile, read_cells
from meshshard.partition import partition
from meshshard.store.format import open_store, verify_store
from meshshard.testing.distributed import run_ranks
from tests.pipelines._dist_preprocess_fns import repartition_rank
from tests.pipelines._vtk_pieces import write_pieces


@pytest.fixture(scope="module")
def meshes(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("pieces")
    make_synthetic_run(root / "raw", 1, surface_cells=1500, volume_cells=900, seed=4)
    out = {}
    for suffix, src, specs in (
        (".vtp", "boundary_1.vtp", DRIVAERML.surface_fields),
        (".vtu", "volume_1.vtu", DRIVAERML.volume_fields),
    ):
        mesh = read_cells(root / "raw" / "run_1" / src, [s.name for s in specs])
        n = mesh.n_cells
        one, many = root / f"one{suffix}", root / f"many{suffix}"
        write_pieces(one, mesh, [0, n], volume=suffix == ".vtu")
        # uneven pieces and an empty one
        write_pieces(many, mesh, [0, n // 7, n // 7, n // 2, n - 5, n], volume=suffix == ".vtu")
        if suffix == ".vtu":  # the length scale nut needs, from the body's STL
            shutil.copy(root / "raw" / "run_1" / "drivaer_1.stl", many.with_suffix(".stl"))
        out[suffix] = (one, many)
    return out


def test_reader_reads_one_piece(meshes):
    one, many = meshes[".vtp"]
    with pytest.raises(UnsupportedVtkXml, match="5 pieces"):
        read_cells(many, [])
    with VtkXmlFile(many, piece=0) as f:
        cells = f.piece_cells
    whole = read_surface(one)
    got = [read_surface(many, piece=p) for p in range(5) if cells[p]]
    np.testing.assert_array_equal(np.concatenate([g.centers for g in got]), whole.centers)
    np.testing.assert_array_equal(np.concatenate([g.fields for g in got]), whole.fields)
    with pytest.raises(ValueError, match="piece=9 out of range"):
        read_cells(many, [], piece=9)


@pytest.mark.parametrize(
    ("suffix", "world", "parts", "method"),
    [(".vtp", 2, 3, "hilbert"), (".vtp", 3, 3, "rcb"), (".vtu", 3, 2, "morton")],
)
def test_pieces_equal_single_process(meshes, tmp_path, suffix, world, parts, method):
    one, many = meshes[suffix]
    dst = tmp_path / "out"
    got = run_ranks(repartition_rank, world, many, dst, parts, method, timeout=240)
    assert got == [("written", "")] * world, got
    part = "surface" if suffix == ".vtp" else "volume"
    if part == "surface":
        ref_data = read_surface(one)
    else:
        ref_data = read_volume(one, length=read_stl(many.with_suffix(".stl")).length)
    ref = partition(ref_data.centers, parts, method)
    store = dst / "many.zarr"
    g, attrs = open_store(store)
    assert verify_store(store)["arrays"] == len(attrs["arrays"])
    assert attrs[part]["partition_ptr"] == ref.offsets.tolist()
    np.testing.assert_array_equal(g[f"{part}_mesh_centers"][...], ref.apply(ref_data.centers))
    np.testing.assert_array_equal(g[f"{part}_fields"][...], ref.apply(ref_data.fields))
    np.testing.assert_array_equal(g[f"{part}_perm"][...], ref.order)
    if part == "surface":
        np.testing.assert_array_equal(g["surface_normals"][...], ref.apply(ref_data.normals))
        np.testing.assert_array_equal(g["surface_areas"][...], ref.apply(ref_data.areas))
    assert attrs[part]["columns"] == ref_data.columns
    again = run_ranks(repartition_rank, world, many, dst, parts, method, timeout=240)
    assert again == [("skipped", "")] * world


def test_splits_must_follow_pieces(meshes, tmp_path):
    _one, many = meshes[".vtp"]
    with VtkXmlFile(many, piece=0) as f:
        n = sum(f.piece_cells)
    got = run_ranks(repartition_rank, 2, many, tmp_path / "o", 2, "hilbert",
                    {"surface": [0, 3, n]}, timeout=120)  # fmt: skip
    for status, text in got:
        assert status == "ValueError" and "piece boundaries" in text, got
    assert not (tmp_path / "o" / "many.zarr").exists()


def test_pieces_are_read_by_one_rank_each(meshes):
    from meshshard.pipelines.distributed_inputs import open_source

    arrays, _ = open_source(meshes[".vtp"][1])
    b = arrays.rank_splits(3)
    assert b[0] == 0 and b[-1] == int(arrays.starts[-1])
    assert set(b) <= set(arrays.starts.tolist())  # whole pieces only
    # more ranks than pieces: some ranks read nothing
    assert len(set(arrays.rank_splits(8))) < 9
