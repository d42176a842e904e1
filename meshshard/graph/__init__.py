"""Sharded graphs and exact domain-parallel message passing.

A :class:`ShardedGraph` is one rank's piece of a graph cut by a
:class:`~meshshard.partition.Partition`: owned nodes in partition order then ghost nodes,
the local ``edge_index`` (every edge owned by the owner of its target, so aggregation at owned
nodes is complete), per-edge features, and the ghost send/receive plan (1 or ``rings`` rings).

- build: :func:`build_graph` (each rank passes only some edges), :func:`from_cells` (the dual
  graph from each rank's own cells), :func:`from_edge_index`,
  :func:`from_adjacency`, :func:`from_pyg` (whole graph on every rank, small cases),
  :func:`build_all` (every part in one process, for preprocessing);
- compute: :func:`refresh_ghosts` (differentiable halo refresh), :func:`aggregate`
  (sum / mean / max at targets), :class:`GhostExchange` (plugs both into a plain-torch model),
  :func:`sync_gradients` (sum replicated-parameter gradients over ranks), :func:`gcn_norm`
  (GCN edge weights from global degrees, for PyG's ``GCNConv`` on a 1-ring graph);
- :class:`GraphPlug`: the same plug on ShardTensors with autograd on the wrapper:
  tensors in and out are ShardTensors, gradients and the loss are global with no user call.
"""

from __future__ import annotations

from meshshard.graph.build import build_all, build_graph, from_adjacency, from_edge_index, from_pyg
from meshshard.graph.dual import from_cells
from meshshard.graph.exchange import GhostExchange, aggregate, refresh_ghosts, sync_gradients
from meshshard.graph.norm import gcn_norm, global_in_degree
from meshshard.graph.plug import GraphPlug
from meshshard.graph.record import ShardedGraph

__all__ = [
    "GhostExchange",
    "GraphPlug",
    "ShardedGraph",
    "aggregate",
    "build_all",
    "build_graph",
    "from_adjacency",
    "from_cells",
    "from_edge_index",
    "from_pyg",
    "gcn_norm",
    "global_in_degree",
    "refresh_ghosts",
    "sync_gradients",
]
