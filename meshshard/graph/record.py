"""The per-rank record of a sharded graph: :class:`ShardedGraph`.

Local numbering
---------------
Rows ``0 .. n_owned - 1`` are this rank's nodes in partition (stored) order; rows
``n_owned .. n_local - 1`` are ghost nodes (copies of other ranks' nodes), sorted by stored row,
hence grouped by owner rank in increasing order, exactly as
:func:`meshshard.ops.halo_exchange` appends them.

Edge ownership (one rule)
-------------------------
Edges are directed, ``edge_index[0]`` = source, ``edge_index[1]`` = target (PyG's
``source_to_target`` flow), and the edge ``i -> j`` is owned by the rank that owns its target
``j``. Every edge of the graph is therefore computed by exactly one rank, and every rank holds
*all* in-edges of its owned nodes, so an aggregation at an owned node is complete without
communication. The first ``n_owned_edges`` local edges are the owned ones; with ``rings > 1``
the rest are copies of the in-edges of ghosts less than ``rings`` hops out (``halo`` edges),
which let ``rings`` layers run after one ghost refresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from meshshard.partition.record import HaloPlan

__all__ = ["ShardedGraph"]


@dataclass(eq=False)
class ShardedGraph:
    """One rank's piece of a graph cut by a :class:`~meshshard.partition.Partition`.

    Build it with :func:`meshshard.graph.build_graph` (each rank passes only some edges),
    :func:`meshshard.graph.from_edge_index` (a full edge list, small cases),
    :func:`meshshard.graph.from_pyg` or :func:`meshshard.datasets.graphstore.load_graph_shard`.

    Attributes
    ----------
    rank, nparts : int
        This rank and the number of ranks (parts).
    num_nodes : int
        Nodes of the whole graph.
    sizes : ndarray of shape (nparts,)
        Owned nodes per rank (the partition's sharding shapes).
    nodes : ndarray of shape (n_local,), int64
        Original (global) id of every local row: owned rows in partition order, then ghosts.
    ghost_depth : ndarray of shape (n_ghost,), int64
        Hops from the nearest owned node (1 .. rings).
    edge_index : Tensor of shape (2, E_local), int64
        ``[source, target]`` in local rows.
    edge_ids : ndarray of shape (E_local,), int64
        Position of every local edge in the global edge list (aligns per-edge features).
    n_owned_edges : int
        The first ``n_owned_edges`` edges have an owned target.
    edge_attr : Tensor of shape (E_local, F), optional
        Per-edge features aligned to the local edges.
    plan : HaloPlan
        This rank's view of the ghost routing: ``send_idx[rank]`` / ``recv_idx[rank]`` are
        filled, other ranks' entries are empty. Used with :func:`meshshard.ops.halo_exchange`.
    rings : int
        Ghost layers held.
    group : ProcessGroup, optional
        The group the graph was built on (``None``: the default group).
    """

    rank: int
    nparts: int
    num_nodes: int
    sizes: np.ndarray
    nodes: np.ndarray
    ghost_depth: np.ndarray
    edge_index: torch.Tensor
    edge_ids: np.ndarray
    n_owned_edges: int
    plan: HaloPlan
    rings: int = 1
    edge_attr: torch.Tensor | None = None
    group: Any = field(default=None, repr=False)

    # ------------------------------------------------------------------ sizes
    @property
    def n_owned(self) -> int:
        return int(self.sizes[self.rank])

    @property
    def n_local(self) -> int:
        return int(self.nodes.size)

    @property
    def n_ghost(self) -> int:
        return self.n_local - self.n_owned

    @property
    def n_edges(self) -> int:
        return int(self.edge_index.shape[1])

    @property
    def offsets(self) -> np.ndarray:
        """``partptr`` of the owned rows (length nparts + 1)."""
        return np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)

    def ghost_rows_moved(self) -> int:
        """Ghost rows this rank receives per refresh."""
        return int(len(self.plan.recv_idx[self.rank]))

    def rows_sent(self) -> int:
        """Rows this rank sends per refresh."""
        return int(len(self.plan.send_idx[self.rank]))

    # ------------------------------------------------------------------ data helpers
    def local_rows(self, x: Any) -> Any:
        """Rows of a whole-graph array (original order) for this rank's local nodes.

        A convenience for tests and small cases: it needs the whole array.
        """
        if isinstance(x, torch.Tensor):
            return x[torch.as_tensor(self.nodes, device=x.device)]
        return np.asarray(x)[self.nodes]

    def local_edges(self, edge_attr: Any) -> Any:
        """Rows of a whole-graph per-edge array (global edge order) for the local edges."""
        if isinstance(edge_attr, torch.Tensor):
            return edge_attr[torch.as_tensor(self.edge_ids, device=edge_attr.device)]
        return np.asarray(edge_attr)[self.edge_ids]

    def owned(self, x: torch.Tensor) -> torch.Tensor:
        """The owned rows of a local array (``x[:n_owned]``)."""
        return x[: self.n_owned]

    def to(self, device: Any) -> ShardedGraph:
        """The same graph with its tensors on ``device``."""
        from dataclasses import replace

        attr = None if self.edge_attr is None else self.edge_attr.to(device)
        return replace(self, edge_index=self.edge_index.to(device), edge_attr=attr)

    def __repr__(self) -> str:
        return (
            f"ShardedGraph(rank={self.rank}/{self.nparts}, owned={self.n_owned}, "
            f"ghosts={self.n_ghost}, edges={self.n_edges} ({self.n_owned_edges} owned), "
            f"rings={self.rings})"
        )
