"""A MeshGraphNet (Pfaff et al., ICLR 2021), in plain torch, with pluggable message passing.

Encoder (node and edge MLPs), a processor of ``layers`` blocks (edge update from the edge and
both end nodes, aggregation at the target, node update; residuals on both), and a node decoder.

Message passing goes through a small object (the *graph plug*) so that the model never knows
where its nodes live:

- ``edge_index``: (2, E) ``[source, target]`` rows of the node tensor;
- ``begin(x)`` -> the node rows the model computes on (e.g. owned + ghost rows);
- ``before_layer(h, i)`` -> ``h`` made current before processor layer ``i`` (a ghost refresh);
- ``aggregate(messages, reduce)`` -> per-node reduction of per-edge messages at the targets;
- ``end(h)`` -> the rows that are this process's output.

:class:`FullGraph` is the single-process plug. ``meshshard.graph.GhostExchange`` is the
domain-parallel one; nothing here imports meshshard.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FullGraph", "GraphMLP", "MeshGraphNet", "ProcessorBlock"]


class FullGraph:
    """The whole graph in one process: no ghosts, aggregation over ``num_nodes`` rows."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int) -> None:
        self.edge_index = edge_index
        self.num_nodes = int(num_nodes)

    def begin(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def before_layer(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        return h

    def aggregate(self, messages: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        index = self.edge_index[1]
        feat = messages.shape[1:]
        out = messages.new_zeros((self.num_nodes, *feat))
        if reduce == "max":
            idx = index.reshape(-1, *([1] * len(feat))).expand_as(messages)
            return out.scatter_reduce(0, idx, messages, reduce="amax", include_self=False)
        out = out.index_add(0, index, messages)
        if reduce == "mean":
            cnt = torch.bincount(index, minlength=self.num_nodes).clamp_min(1).to(out.dtype)
            out = out / cnt.reshape(-1, *([1] * len(feat)))
        elif reduce != "sum":
            msg = f"reduce={reduce!r} must be one of 'sum', 'mean', 'max'"
            raise ValueError(msg)
        return out

    def end(self, h: torch.Tensor) -> torch.Tensor:
        return h


class GraphMLP(nn.Sequential):
    """Linear -> SiLU (x hidden layers) -> Linear, optionally followed by LayerNorm."""

    def __init__(self, n_in: int, n_hidden: int, n_out: int, hidden_layers: int = 1,
                 norm: bool = True) -> None:  # fmt: skip
        mods: list[nn.Module] = [nn.Linear(n_in, n_hidden), nn.SiLU()]
        for _ in range(hidden_layers - 1):
            mods += [nn.Linear(n_hidden, n_hidden), nn.SiLU()]
        mods.append(nn.Linear(n_hidden, n_out))
        if norm:
            mods.append(nn.LayerNorm(n_out))
        super().__init__(*mods)


class ProcessorBlock(nn.Module):
    """One edge update + aggregation + node update, with residuals."""

    def __init__(self, hidden: int, hidden_layers: int = 1, aggr: str = "sum") -> None:
        super().__init__()
        self.edge_mlp = GraphMLP(3 * hidden, hidden, hidden, hidden_layers)
        self.node_mlp = GraphMLP(2 * hidden, hidden, hidden, hidden_layers)
        self.aggr = aggr

    def forward(self, h: torch.Tensor, e: torch.Tensor, graph) -> tuple[torch.Tensor, torch.Tensor]:
        src, dst = graph.edge_index[0], graph.edge_index[1]
        e = e + self.edge_mlp(torch.cat([e, h[src], h[dst]], dim=-1))
        agg = graph.aggregate(e, self.aggr)
        h = h + self.node_mlp(torch.cat([h, agg], dim=-1))
        return h, e


class MeshGraphNet(nn.Module):
    """Encode-process-decode graph network over mesh nodes and edges.

    Parameters
    ----------
    node_in, edge_in, out : int
        Input node features, input edge features, output node features.
    hidden : int
        Latent width.
    layers : int
        Processor blocks (message-passing steps).
    hidden_layers : int
        Hidden layers of every MLP.
    aggr : {"sum", "mean", "max"}
        Aggregation at the target nodes.

    Examples
    --------
    >>> import torch
    >>> ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    >>> model = MeshGraphNet(3, 2, 1, hidden=8, layers=2)
    >>> model(torch.randn(3, 3), torch.randn(4, 2), FullGraph(ei, 3)).shape
    torch.Size([3, 1])
    """

    def __init__(self, node_in: int, edge_in: int, out: int, *, hidden: int = 128,
                 layers: int = 15, hidden_layers: int = 1, aggr: str = "sum") -> None:  # fmt: skip
        super().__init__()
        if aggr not in ("sum", "mean", "max"):
            msg = f"aggr={aggr!r} must be one of 'sum', 'mean', 'max'"
            raise ValueError(msg)
        self.layers = int(layers)
        self.node_encoder = GraphMLP(node_in, hidden, hidden, hidden_layers)
        self.edge_encoder = GraphMLP(edge_in, hidden, hidden, hidden_layers)
        self.processor = nn.ModuleList(
            ProcessorBlock(hidden, hidden_layers, aggr) for _ in range(layers)
        )
        self.decoder = GraphMLP(hidden, hidden, out, hidden_layers, norm=False)

    def forward(self, x: torch.Tensor, edge_attr: torch.Tensor, graph) -> torch.Tensor:
        """``x``: node features (rows as ``graph.begin`` expects), ``edge_attr``: (E, edge_in)
        aligned to ``graph.edge_index``; returns ``graph.end`` of the decoded nodes."""
        h = self.node_encoder(graph.begin(x))
        e = self.edge_encoder(edge_attr)
        for i, block in enumerate(self.processor):
            h = graph.before_layer(h, i)
            h, e = block(h, e, graph)
        return self.decoder(graph.end(h))
