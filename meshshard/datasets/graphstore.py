"""Dual-graph shards stored beside the cell fields, so training reads only its rank's graph.

``meshshard preprocess ... --graph dual`` (:func:`write_graph`) adds to ``run_<i>.zarr``, for
the surface cells in *stored* (partition) order and every part ``p``:

    surface_graph_nodes  (sum n_local,) i8  stored row of every local node: owned rows then
                                            ghosts (ascending), part after part
    surface_graph_node_split (P+1,) i8      where each part's nodes start
    surface_graph_depth  (sum n_ghost,) i8  hops of every ghost from the part's own cells
    surface_graph_edges  (sum E_local, 2) i8 local [source, target], owned edges first
    surface_graph_edge_ids (sum E_local,) i8 position in the whole dual graph's CSR
    surface_graph_edge_split (P+1,) i8, surface_graph_owned_edges (P,) i8
    surface_graph_send_idx (sum sent,) i8   local rows each part sends, by destination
    surface_graph_send_ptr (P, P+1) i8, surface_graph_send_split (P+1,) i8

and ``attrs["surface_graph"]`` (kind, rings, edges, ghosts per part). :func:`load_graph_shard`
reads one part's slices into a :class:`~meshshard.graph.ShardedGraph` (no collective). The
shards come from :func:`meshshard.graph.build_all`, the same code that builds them on live ranks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.datasets.drivaerml import _read_cells, run_index
from meshshard.datasets.schema import DRIVAERML
from meshshard.graph import ShardedGraph, build_all
from meshshard.partition.graph import dual_graph
from meshshard.partition.record import HaloPlan
from meshshard.partition.weld import weld_points
from meshshard.store.format import StoreError, open_store, seal_store

__all__ = [
    "GRAPH_KINDS",
    "load_graph_shard",
    "surface_dual_adjacency",
    "surface_dual_edges",
    "write_graph",
]

log = logging.getLogger(__name__)

GRAPH_KINDS = ("dual",)
_PREFIX = "surface_graph"


def surface_dual_edges(run_dir: str | Path, source_index: np.ndarray, schema: Any = None):
    """Edges ``(2, E)`` of the surface's dual graph (cells sharing an edge) over the rows of a
    :class:`~meshshard.datasets.drivaerml.SurfaceData` (row ``j`` = source cell
    ``source_index[j]``; edges to dropped cells are left out). Coincident points are merged
    first (:func:`~meshshard.partition.weld.weld_points`, logged)."""
    schema = schema or DRIVAERML
    run_dir = Path(run_dir)
    path = run_dir / schema.surface_file.format(i=run_index(run_dir, schema))
    mesh, _ = _read_cells(path, (), polys=True)
    nv = np.diff(mesh.offsets)
    types = np.where(nv == 3, 5, np.where(nv == 4, 9, 7))
    # a surface whose patches carry their own copies of shared points (foamToVTK's) would
    # fall apart into one piece per patch
    weld = weld_points(mesh.points, mesh.connectivity, mesh.offsets)
    if weld.merged:
        log.info("%s: %s for the dual graph", path, weld.describe())
    conn = weld.apply(mesh.connectivity)
    adj = dual_graph(cells=conn, offsets=mesh.offsets, celltypes=types).tocoo()
    row_of = np.full(nv.size, -1, dtype=np.int64)
    row_of[np.asarray(source_index, dtype=np.int64)] = np.arange(len(source_index))
    s, d = row_of[adj.row], row_of[adj.col]
    keep = (s >= 0) & (d >= 0)
    return np.stack([s[keep], d[keep]])


def surface_dual_adjacency(run_dir: str | Path, source_index: np.ndarray, schema: Any = None):
    """:func:`surface_dual_edges` and the same graph as a symmetric scipy CSR matrix (for
    METIS): ``(edges, adjacency)``."""
    import scipy.sparse as sp

    edges = surface_dual_edges(run_dir, source_index, schema)
    n = len(source_index)
    adj = sp.csr_matrix((np.ones(edges.shape[1], dtype=np.int8), (edges[0], edges[1])),
                        shape=(n, n))  # fmt: skip
    return edges, adj


def write_graph(
    store: str | Path,
    run_dir: str | Path,
    partition: Any,
    data: Any,
    kind: str = "dual",
    *,
    rings: int = 1,
    schema: Any = None,
    edges: np.ndarray | None = None,
) -> dict:
    """Add every part's dual-graph shard to a (temporary) store written by ``write_store``.

    Parameters
    ----------
    store : path
        The zarr group (not yet renamed to its final name).
    run_dir : path
        The run directory (its surface file is read again for the connectivity).
    partition : Partition
        The surface partition the store was written with.
    data : RunData
        The run as read (its surface's ``source_index`` maps rows to source cells).
    kind : {"dual"}
    rings : int
        Ghost rings per part (1: a refresh per layer; L: one refresh before L layers).
    edges : ndarray of shape (2, E), optional
        :func:`surface_dual_edges` of this run when the caller already has them.

    Returns
    -------
    dict
        The ``surface_graph`` attributes written.
    """
    import zarr

    if kind not in GRAPH_KINDS:
        msg = f"graph={kind!r} is not one of {GRAPH_KINDS}"
        raise ValueError(msg)
    if data.surface is None or partition is None:
        msg = "graph='dual' stores the surface's dual graph: preprocess the surface too"
        raise ValueError(msg)
    if edges is None:
        edges = surface_dual_edges(run_dir, data.surface.source_index, schema)
    pieces = build_all(partition, edges, rings=rings, symmetric=True)
    inv = partition.inverse
    P = partition.nparts
    arrays = {
        "nodes": np.concatenate([inv[g.nodes] for g in pieces]),
        "depth": np.concatenate([g.ghost_depth for g in pieces]),
        "edges": np.concatenate([g.edge_index.numpy().T for g in pieces]).reshape(-1, 2),
        "edge_ids": np.concatenate([g.edge_ids for g in pieces]),
        "owned_edges": np.array([g.n_owned_edges for g in pieces], dtype=np.int64),
        "send_idx": np.concatenate([g.plan.send_idx[g.rank] for g in pieces]),
        "send_ptr": np.stack([g.plan.send_ptr[g.rank] for g in pieces]),
    }
    for name, sizes in (
        ("node", [g.n_local for g in pieces]),
        ("edge", [g.n_edges for g in pieces]),
        ("send", [g.rows_sent() for g in pieces]),
    ):
        arrays[f"{name}_split"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    group = zarr.open_group(str(store), mode="r+")
    shapes = dict(group.attrs.get("arrays", {}))
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr, dtype=np.int64)
        key = f"{_PREFIX}_{name}"
        chunks = (max(1, min(arr.shape[0], 1 << 20)),) + arr.shape[1:]
        z = group.create_array(key, shape=arr.shape, dtype=arr.dtype, chunks=chunks)
        if arr.size:
            z[...] = arr
        shapes[key] = list(arr.shape)
    meta = {
        "kind": kind,
        "rings": int(rings),
        "nparts": P,
        "edges": int(edges.shape[1]),
        "ghosts": [g.n_ghost for g in pieces],
        "local_edges": [g.n_edges for g in pieces],
    }
    attrs = dict(group.attrs)
    records = dict(attrs.get("integrity", {}).get("arrays", {}))
    attrs.update(arrays=shapes, **{_PREFIX: meta})
    seal_store(group, Path(store), attrs, records)  # checksums of the new arrays; complete last
    log.info("%s: %s graph shards, %d edges, ghosts %s", store, kind, meta["edges"], meta["ghosts"])
    return meta


def load_graph_shard(store: str | Path, rank: int, world_size: int, *, group: Any = None):
    """This rank's :class:`~meshshard.graph.ShardedGraph` of a store's surface dual graph.

    Node ids are *stored* rows (the store's partition order), so owned rows are exactly the rows
    :func:`meshshard.datasets.load_shard` returns for this rank; ``world_size`` must equal the
    store's number of parts. No collective (every rank reads its own slices).

    Raises
    ------
    StoreError
        The store has no graph (preprocess with ``--graph dual``).
    ValueError
        ``world_size`` differs from the store's parts, or a bad rank.
    """
    import torch

    grp, attrs = open_store(store)
    meta = attrs.get(_PREFIX)
    if meta is None:
        msg = f"{store}: has no graph shards; preprocess it with --graph dual"
        raise StoreError(msg)
    P = int(meta["nparts"])
    if world_size != P:
        msg = (
            f"{store}: the graph was stored for {P} parts but world_size={world_size}; run with "
            f"{P} ranks or preprocess again with --parts {world_size} --overwrite"
        )
        raise ValueError(msg)
    if not 0 <= rank < P:
        msg = f"rank={rank} out of range for {P} parts"
        raise ValueError(msg)

    def part(name: str, split: str) -> np.ndarray:
        s = np.asarray(grp[f"{_PREFIX}_{split}_split"][rank : rank + 2])
        return np.asarray(grp[f"{_PREFIX}_{name}"][int(s[0]) : int(s[1])])

    off = np.asarray(attrs["surface"]["partition_ptr"], dtype=np.int64)
    sizes = np.diff(off)
    nodes = part("nodes", "node")
    n_owned = int(sizes[rank])
    ghosts = nodes[n_owned:]
    dsplit = np.concatenate([[0], np.cumsum(np.asarray(meta["ghosts"]))])
    depth = np.asarray(grp[f"{_PREFIX}_depth"][int(dsplit[rank]) : int(dsplit[rank + 1])])
    edges = part("edges", "edge")
    send_idx = part("send_idx", "send")
    send_ptr = np.asarray(grp[f"{_PREFIX}_send_ptr"][rank])
    empty_ptr, empty_idx = np.zeros(P + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)

    def mine(x: np.ndarray, empty: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(x if q == rank else empty for q in range(P))

    plan = HaloPlan(
        offsets=off,
        send_ptr=mine(send_ptr, empty_ptr),
        send_idx=mine(send_idx, empty_idx),
        recv_ptr=mine(np.searchsorted(ghosts, off).astype(np.int64), empty_ptr),
        recv_idx=mine(ghosts.astype(np.int64), empty_idx),
        kind="graph-rank-view",
        params={"rings": int(meta["rings"]), "rank": rank},
    )
    return ShardedGraph(
        rank=rank,
        nparts=P,
        num_nodes=int(off[-1]),
        sizes=sizes,
        nodes=nodes.astype(np.int64),
        ghost_depth=depth.astype(np.int64),
        edge_index=torch.from_numpy(np.ascontiguousarray(edges.T, dtype=np.int64)),
        edge_ids=part("edge_ids", "edge"),
        n_owned_edges=int(np.asarray(grp[f"{_PREFIX}_owned_edges"][rank])),
        plan=plan,
        rings=int(meta["rings"]),
        group=group,
    )
