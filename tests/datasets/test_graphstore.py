"""`meshshard preprocess --graph dual` stores each part's dual-graph shard; a rank reads only its
own and gets the same ShardedGraph the ranks would build."""

from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.cli import main
from meshshard.datasets import load_shard
from meshshard.datasets.graphstore import load_graph_shard
from meshshard.graph import build_all
from meshshard.partition import Partition, dual_graph
from meshshard.store.format import StoreError, open_store, store_partition, verify_store


@pytest.fixture(scope="module")
def graph_store(runs_src, tmp_path_factory):
    dst = tmp_path_factory.mktemp("gstores")
    code = main(["preprocess", "drivaerml", str(runs_src), str(dst), "--parts", "3",
                 "--method", "metis", "--surface", "--graph", "dual", "--runs", "run_1",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    return dst / "run_1.zarr"


def test_graph_store_passes_the_integrity_checks(graph_store, tmp_path):
    """The graph arrays are in the integrity record (every checksum verifies) and their rows
    are not checked against the surface's; a damaged graph chunk is found."""
    import shutil

    rec = verify_store(graph_store)
    assert rec["checksums"] and rec["arrays"] == len(open_store(graph_store)[1]["arrays"])
    bad = tmp_path / "run_1.zarr"
    shutil.copytree(graph_store, bad)
    chunk = next((bad / "surface_graph_edges" / "c").rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="surface_graph_edges.*crc32"):
        verify_store(bad)


def test_stored_shards_equal_the_built_ones(graph_store, runs_src):
    part, _ = store_partition(graph_store)
    mesh = pv.read(runs_src / "run_1" / "boundary_1.vtp")
    adj = dual_graph(mesh).tocoo()  # source-cell numbering = store_partition's numbering
    want = build_all(part, np.stack([adj.row, adj.col]), symmetric=True)
    stored = Partition(np.asarray(part.assignment[part.order]), np.arange(part.num_points),
                       part.sizes)  # fmt: skip
    for rank in range(3):
        g = load_graph_shard(graph_store, rank, 3)
        w = want[rank]
        np.testing.assert_array_equal(g.nodes, part.inverse[w.nodes])  # stored rows
        np.testing.assert_array_equal(g.nodes[: g.n_owned], stored.shard_rows(rank))
        np.testing.assert_array_equal(g.edge_index.numpy(), w.edge_index.numpy())
        assert g.n_owned_edges == w.n_owned_edges and g.n_ghost > 0
        for a, b in ((g.plan, w.plan),):
            np.testing.assert_array_equal(a.send_idx[rank], b.send_idx[rank])
            np.testing.assert_array_equal(a.send_ptr[rank], b.send_ptr[rank])
            np.testing.assert_array_equal(a.recv_ptr[rank], b.recv_ptr[rank])
        # the owned rows are exactly the rows load_shard gives this rank
        rows = load_shard(graph_store, rank, 3, keys=["surface_perm"])["surface_perm"]
        assert rows.shape[0] == g.n_owned


def test_metis_with_graph_dual_cuts_the_dual_graph_for_volume(graph_store, runs_src):
    """preprocess --method metis --graph dual partitions the surface on its dual graph with the
    volume objective: no more ghost rows than METIS on the centres' kNN graph."""
    from meshshard.partition import metrics, partition

    part, _ = store_partition(graph_store)
    assert part.params["graph"] == "given" and part.params["objective"] == "vol"
    mesh = pv.read(runs_src / "run_1" / "boundary_1.vtp")
    adj = dual_graph(mesh)
    knn = partition(mesh.cell_centers().points, 3, method="metis")
    assert knn.params["graph"] == "knn8"
    ours = metrics(part, graph=adj)["comm_volume"]
    assert 0 < ours <= metrics(knn, graph=adj)["comm_volume"]


def test_inspect_reports_the_graph(graph_store):
    from meshshard.store import inspect_store

    info = inspect_store(graph_store)["surface_graph"]
    assert info["kind"] == "dual" and info["rings"] == 1 and info["nparts"] == 3
    assert len(info["ghosts"]) == 3 and min(info["ghosts"]) > 0 and info["edges"] > 0


def test_missing_graph_and_wrong_world_size(graph_store, runs_src, tmp_path):
    with pytest.raises(ValueError, match="stored for 3 parts"):
        load_graph_shard(graph_store, 0, 2)
    main(["preprocess", "drivaerml", str(runs_src), str(tmp_path), "--parts", "2", "--surface",
          "--runs", "run_2", "--no-progress"])  # fmt: skip
    with pytest.raises(StoreError, match="--graph dual"):
        load_graph_shard(tmp_path / "run_2.zarr", 0, 2)


@pytest.fixture(scope="module")
def hyper_store(runs_src, tmp_path_factory):
    pytest.importorskip("mtkahypar")
    dst = tmp_path_factory.mktemp("hstores")
    code = main(["preprocess", "drivaerml", str(runs_src), str(dst), "--parts", "3",
                 "--method", "hypergraph", "--surface", "--graph", "dual", "--runs", "run_1",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    return dst / "run_1.zarr"


def test_hypergraph_with_graph_dual_stores_the_same_kind_of_shards(hyper_store, graph_store,
                                                                   runs_src):  # fmt: skip
    """preprocess --method hypergraph --graph dual cuts the dual graph itself and stores graph
    shards exactly as METIS' store does: each rank's shard equals the one built from the
    stored partition, and the ghosts stored are the dual graph's 1-ring ghost rows."""
    from meshshard.partition import metrics

    part, _ = store_partition(hyper_store)
    assert part.method == "hypergraph" and part.params["graph"] == "given"
    mesh = pv.read(runs_src / "run_1" / "boundary_1.vtp")
    adj = dual_graph(mesh)
    coo = adj.tocoo()
    want = build_all(part, np.stack([coo.row, coo.col]), symmetric=True)
    ghosts = 0
    for rank in range(3):
        g, w = load_graph_shard(hyper_store, rank, 3), want[rank]
        np.testing.assert_array_equal(g.nodes, part.inverse[w.nodes])
        np.testing.assert_array_equal(g.edge_index.numpy(), w.edge_index.numpy())
        assert g.n_owned_edges == w.n_owned_edges
        ghosts += g.n_ghost
    ours = metrics(part, graph=adj)
    assert ghosts == ours["ghost_rows"]["1"] > 0
    info, ref = inspect_store_graph(hyper_store), inspect_store_graph(graph_store)
    assert set(info) == set(ref) and info["kind"] == "dual" and info["nparts"] == 3
    metis_part, _ = store_partition(graph_store)
    assert ours["ghost_rows"]["1"] <= 1.1 * metrics(metis_part, graph=adj)["ghost_rows"]["1"]


def inspect_store_graph(path):
    from meshshard.store import inspect_store

    return inspect_store(path)["surface_graph"]


def test_hypergraph_without_mtkahypar_fails_before_reading(runs_src, tmp_path, monkeypatch,
                                                           capsys):  # fmt: skip
    from meshshard.partition import hypergraph as hg_mod

    monkeypatch.setattr(hg_mod, "WITH_MTKAHYPAR", False)
    code = main(["preprocess", "drivaerml", str(runs_src), str(tmp_path / "out"), "--parts", "2",
                 "--method", "hypergraph", "--graph", "dual", "--no-progress"])  # fmt: skip
    assert code == 2 and r"pip install meshshard[hypergraph]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
