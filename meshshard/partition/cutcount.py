"""Cut metrics of a cell-mesh partition without building the whole dual graph.

Only faces whose vertices all touch cells of two or more shards can be cut, and both cells of
such a face touch the interface. So the cut edges of the dual graph are exactly the cut edges
of the dual graph of the *interface cells* (cells with two or more such vertices), usually a
few percent of the mesh. Finding those cells is one pass over the connectivity; the face
hashing of :func:`~meshshard.partition.dual_graph` then runs on them only.

What this gives exactly: edge cut, communication volume, halo sizes and neighbouring shards
(the numbers :func:`meshshard.partition.quality.metrics` computes on the full dual graph).
What it cannot give: the total number of dual edges and the contiguity of each shard (both
need every face).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshshard.partition._validation import unique_int
from meshshard.partition.graph import dual_graph, mesh_connectivity, mesh_polyhedra
from meshshard.partition.quality import _stats
from meshshard.partition.record import Partition

__all__ = ["dual_cut_metrics", "interface_cells"]


def interface_cells(
    conn: np.ndarray, offsets: np.ndarray, assignment: np.ndarray, npoints: int
) -> np.ndarray:
    """Ids of the cells with at least two vertices also used by a cell of another shard.

    One pass over the connectivity: every vertex records the shard of some cell using it,
    and a vertex is on the interface when another cell using it has a different shard.

    Parameters
    ----------
    conn : int array
        Flat connectivity (vertex ids).
    offsets : int array of shape (ncells + 1,)
    assignment : int array of shape (ncells,)
        Shard of every cell.
    npoints : int
        Number of mesh vertices.
    """
    counts = np.diff(offsets)
    lab = np.repeat(np.asarray(assignment, dtype=np.int64), counts)
    seen = np.full(npoints, -1, dtype=np.int64)
    seen[conn] = lab  # the shard of any one cell using each vertex
    on_iface = np.zeros(npoints, dtype=bool)
    on_iface[conn[seen[conn] != lab]] = True
    cs = np.concatenate([[0], np.cumsum(on_iface[conn], dtype=np.int64)])
    per_cell = cs[offsets[1:]] - cs[offsets[:-1]]
    return np.flatnonzero(per_cell >= 2)


def dual_cut_metrics(mesh: Any, partition: Partition, weld: Any = None) -> dict[str, Any]:
    """Edge cut, communication volume, halos and neighbours of ``partition`` on the dual graph
    of ``mesh``'s cells, building the dual graph of the interface cells only.

    Parameters
    ----------
    mesh : pyvista.DataSet
        Polygon surface or volume mesh of linear cells and polyhedra (what :func:`dual_graph`
        takes).
    partition : Partition
        Over the mesh's cells.
    weld : Weld, optional
        Coincident points merged first (:func:`meshshard.partition.weld.weld_points`).

    Returns
    -------
    dict
        ``edge_cut``, ``comm_volume``, ``halo_sizes``, ``halo_volume``, ``neighbours``,
        ``neighbours_stats`` (equal to :func:`meshshard.partition.metrics` with
        ``graph=dual_graph(mesh)``) and ``interface_cells`` (how many cells were hashed).

    Raises
    ------
    ValueError
        The partition is not over the mesh's cells; unsupported cell types (from
        :func:`dual_graph`).

    Examples
    --------
    >>> import numpy as np, pyvista as pv
    >>> from meshshard.partition import partition
    >>> from meshshard.partition.io import cell_centers
    >>> grid = pv.ImageData(dimensions=(5, 5, 5)).cast_to_unstructured_grid()
    >>> dual_cut_metrics(grid, partition(cell_centers(grid), 2, method="rcb"))["edge_cut"]
    16
    """
    conn, off, types = mesh_connectivity(mesh)
    poly = mesh_polyhedra(mesh)
    if weld is not None:
        conn = weld.apply(conn)
        poly = None if poly is None else poly.renumbered(weld)
    a = partition.assignment
    n, P = a.size, partition.nparts
    if types.size != n:
        msg = f"the partition has {n} rows but the mesh has {types.size} cells"
        raise ValueError(msg)
    sub = interface_cells(conn, off, a, int(mesh.n_points))  # (merged ids are < n_points)
    r = c = np.zeros(0, dtype=np.int64)
    if sub.size:
        lens = np.diff(off)[sub]
        sub_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        local = np.arange(sub_off[-1], dtype=np.int64) - np.repeat(sub_off[:-1], lens)
        sub_conn = conn[np.repeat(off[sub], lens) + local]
        sub_poly = poly.subset(sub) if poly is not None else None
        g = dual_graph(cells=sub_conn, offsets=sub_off, celltypes=types[sub],
                       polyhedra=sub_poly).tocoo()  # fmt: skip
        keep = g.row < g.col  # each undirected edge once
        r, c = sub[g.row[keep]], sub[g.col[keep]]
        cut = a[r] != a[c]
        r, c = r[cut], c[cut]
    rows, cols = np.concatenate([r, c]), np.concatenate([c, r])
    pr, pc = a[rows], a[cols]
    halo_pairs = unique_int(pr * n + cols)
    halo_sizes = np.bincount(halo_pairs // max(n, 1), minlength=P)
    shard_pairs = unique_int(pr * P + pc)
    neighbours = np.bincount(shard_pairs // P, minlength=P)
    return {
        "edge_cut": int(r.size),
        "comm_volume": int(unique_int(rows * P + pc).size),
        "halo_sizes": halo_sizes.tolist(),
        "halo_volume": int(halo_sizes.sum()),
        "neighbours": neighbours.tolist(),
        "neighbours_stats": _stats(neighbours),
        "interface_cells": int(sub.size),
    }
