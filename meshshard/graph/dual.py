"""The dual graph of a cell mesh, built by the ranks from their own cells only.

Each rank passes the cells it owns (connectivity with *global* vertex ids). Every face is sent
to a rank chosen by a hash of its sorted vertex ids, where the cells sharing it meet and become
edges (both directions); each edge then travels to the owner of its target, duplicates (two
cells sharing several faces) are dropped there, and :func:`meshshard.graph.build._build` makes
the ghosts and send lists. No rank holds the whole mesh or the whole graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshshard.comm.transport import DistComm
from meshshard.graph.build import _build, _prepare, _split_by
from meshshard.graph.record import ShardedGraph
from meshshard.partition.faces import cell_faces, face_width, row_hash, shared_face_pairs
from meshshard.partition.graph import _connectivity_from_args
from meshshard.partition.record import Partition

__all__ = ["from_cells"]


def _face_rank(keys: np.ndarray, size: int) -> np.ndarray:
    """A rank for every face row, the same on every rank."""
    return (row_hash(keys) % np.uint64(size)).astype(np.int64)


def from_cells(
    partition: Partition,
    cell_ids: Any,
    cells: Any,
    *,
    offsets: Any = None,
    celltypes: Any,
    polyhedra: Any = None,
    rings: int = 1,
    group: Any = None,
) -> ShardedGraph:
    """This rank's piece of the dual graph (cells sharing a face, or an edge for 2-D cells)
    from the cells this rank holds.

    Collective: every rank of ``group`` must call this.

    Parameters
    ----------
    partition : Partition
        Of the cells, as many parts as ranks.
    cell_ids : array of shape (n_cells_r,), int
        Global (original) ids of this rank's cells (usually ``partition.shard_rows(rank)``;
        any split of the cells over the ranks works).
    cells, offsets, celltypes
        As in :func:`meshshard.partition.dual_graph`: an (n, nverts) array with one VTK type,
        or flat connectivity with ``offsets`` and one type per cell; vertex ids global.
    polyhedra : PolyhedronFaces, optional
        The faces of this rank's polyhedral cells (type 42), one entry per cell of ``cells``;
        point ids global.
    rings : int
        Ghost layers.

    Returns
    -------
    ShardedGraph
        Edges are the dual graph's, in both directions; edge ids number each rank's owned
        edges after the previous rank's (sorted by target, then source).
    """
    partition, inverse = _prepare(partition)
    comm = DistComm(group)
    P, rank = comm.size, comm.rank
    ids = np.asarray(cell_ids, dtype=np.int64).reshape(-1)
    problem = None
    width = 4
    try:
        conn, off, types, poly = _connectivity_from_args(None, cells, offsets, celltypes,
                                                         polyhedra)  # fmt: skip
        width = face_width(types, poly)
        if types.size != ids.size:
            problem = (
                f"from_cells: rank {rank} has {types.size} cells but {ids.size} cell_ids; give "
                "one id per cell"
            )
        elif ids.size and (ids.min() < 0 or ids.max() >= partition.num_points):
            problem = (
                f"from_cells: rank {rank} has cell ids {int(ids.min())}..{int(ids.max())}, "
                f"outside the partition's {partition.num_points} cells"
            )
    except (ValueError, TypeError) as exc:
        problem = f"from_cells: rank {rank}: {exc}"
    comm.flag(problem, "from_cells")
    # every rank's face rows get the same width (the widest polyhedron face anywhere)
    width = max(comm.allgather_int(width))
    try:
        keys, local = cell_faces(conn, off, types, poly, width=width)
    except ValueError as exc:  # a cell type or vertex count the face tables refuse
        problem = f"from_cells: rank {rank}: {exc}"
    comm.flag(problem, "from_cells")
    owner_cell = ids[local]
    parts = _split_by(_face_rank(keys, P), P, keys, owner_cell)
    keys = np.concatenate(comm.exchange(parts[0])).reshape(-1, keys.shape[1])
    owner_cell = np.concatenate(comm.exchange(parts[1]))
    r, c = shared_face_pairs(keys, owner_cell)
    keep = r != c
    src = np.concatenate([r[keep], c[keep]])
    dst = np.concatenate([c[keep], r[keep]])
    a = partition.assignment
    pairs = _split_by(a[dst], P, np.stack([src, dst], axis=1))[0]
    got = np.concatenate(comm.exchange(pairs)).reshape(-1, 2)
    n = np.int64(max(partition.num_points, 1))
    key = np.unique(inverse[got[:, 1]] * n + got[:, 0])  # by (stored target, source), deduped
    src, dst = key % n, partition.order[key // n]
    counts = comm.allgather_int(src.size)
    start = sum(counts[:rank])
    eid = np.arange(start, start + src.size, dtype=np.int64)
    return _build(comm, partition, inverse, src, dst, eid, None, rings=rings, symmetric=False,
                  routed=True)  # fmt: skip
