"""Graph normalisations that need *global* node degrees, computed on a ShardedGraph.

GCN's symmetric normalisation weighs the edge ``j -> i`` by ``1 / sqrt(deg(i) deg(j))``. On a
rank's subgraph an owned node has all its in-edges (the edge ownership rule), but a ghost has
only those within the held rings, so PyG's own ``gcn_norm`` on the local subgraph is wrong for
edges from ring-1 ghosts unless the graph holds 2 rings. :func:`gcn_norm` takes the owners'
degrees through one ghost refresh instead, so ``GCNConv(normalize=False)`` with these weights is
exact on a 1-ring graph.
"""

from __future__ import annotations

import torch

from meshshard.graph.exchange import refresh_ghosts
from meshshard.graph.record import ShardedGraph

__all__ = ["gcn_norm", "global_in_degree"]


def global_in_degree(graph: ShardedGraph, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """In-degree in the whole graph of every local row (owned and ghost), shape (n_local,).

    Collective: every rank of ``graph.group`` must call this (one ghost refresh).
    """
    dst = graph.edge_index[1, : graph.n_owned_edges]
    deg = torch.bincount(dst, minlength=graph.n_owned)[: graph.n_owned].to(dtype)
    return refresh_ghosts(deg.reshape(-1, 1), graph).reshape(-1)


def gcn_norm(
    graph: ShardedGraph, *, add_self_loops: bool = True, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, edge_weight)`` with GCN's symmetric normalisation by global degrees.

    Use with ``torch_geometric.nn.GCNConv(..., normalize=False)``: the owned rows then equal
    ``GCNConv`` (default normalisation) on the whole graph. Self loops (when added) are appended
    for every local row.

    Collective: every rank of ``graph.group`` must call this (one ghost refresh).
    """
    deg = global_in_degree(graph, dtype=dtype)
    ei = graph.edge_index
    if add_self_loops:
        deg = deg + 1
        loops = torch.arange(graph.n_local, dtype=ei.dtype, device=ei.device)
        ei = torch.cat([ei, torch.stack([loops, loops])], dim=1)
    inv = deg.pow(-0.5)
    inv[torch.isinf(inv)] = 0
    return ei, inv[ei[0]] * inv[ei[1]]
