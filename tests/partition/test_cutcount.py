"""Cut metrics from the interface cells equal the metrics on the whole dual graph."""

from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.partition import Partition, dual_graph, partition
from meshshard.partition.cutcount import dual_cut_metrics, interface_cells
from meshshard.partition.graph import mesh_connectivity
from meshshard.partition.io import cell_centers
from meshshard.partition.quality import metrics

KEYS = ("edge_cut", "comm_volume", "halo_sizes", "halo_volume", "neighbours", "neighbours_stats")


def _meshes():
    tets = pv.ImageData(dimensions=(9, 8, 7)).triangulate()
    hexes = pv.ImageData(dimensions=(9, 8, 7)).cast_to_unstructured_grid()
    sphere = pv.Sphere(theta_resolution=20, phi_resolution=20)  # triangles
    quads = pv.Plane(i_resolution=15, j_resolution=11)
    mixed = hexes.merge(pv.ImageData(dimensions=(4, 4, 4), origin=(8, 0, 0)).triangulate())
    return {"tets": tets, "hexes": hexes, "sphere": sphere, "quads": quads, "mixed": mixed}


@pytest.mark.parametrize("name", list(_meshes()))
@pytest.mark.parametrize("method", ["hilbert", "morton", "rcb", "metis"])
def test_equals_full_dual_graph_metrics(name, method):
    mesh = _meshes()[name]
    g = dual_graph(mesh)
    extra = {"graph": g} if method == "metis" else {}
    part = partition(cell_centers(mesh), 5, method=method, **extra)
    full, cut = metrics(part, graph=g), dual_cut_metrics(mesh, part)
    assert full["edge_cut"] > 0
    assert {k: cut[k] for k in KEYS} == {k: full[k] for k in KEYS}
    assert cut["interface_cells"] < mesh.n_cells


def test_random_labels_and_empty_shards():
    mesh = _meshes()["tets"]
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, mesh.n_cells) * 2  # shards 1, 3, 5 empty; cuts everywhere
    part = Partition.from_assignment(a, 7)
    full, cut = metrics(part, graph=dual_graph(mesh)), dual_cut_metrics(mesh, part)
    assert {k: cut[k] for k in KEYS} == {k: full[k] for k in KEYS}


def test_one_shard_has_no_interface():
    mesh = _meshes()["hexes"]
    conn, off, _ = mesh_connectivity(mesh)
    assert interface_cells(conn, off, np.zeros(mesh.n_cells, np.int64), mesh.n_points).size == 0
    cut = dual_cut_metrics(mesh, Partition.from_assignment(np.zeros(mesh.n_cells, int), 1))
    assert cut["edge_cut"] == 0 and cut["halo_sizes"] == [0]


def test_wrong_length_is_refused():
    mesh = _meshes()["hexes"]
    with pytest.raises(ValueError, match="the partition has 3 rows but the mesh has"):
        dual_cut_metrics(mesh, Partition.from_assignment(np.zeros(3, int), 1))
