"""The graph plug for ShardTensors with autograd on the wrapper: a model's
node and edge tensors are ShardTensors in and out, and gradients and the loss are global by
construction — no ``sync_gradients``, no loss scaling by hand.

:class:`GraphPlug` implements the protocol of :class:`meshshard.models.meshgraphnet.FullGraph`
(``edge_index``, ``begin``, ``before_layer``, ``aggregate``, ``end``) on a
:class:`~meshshard.graph.ShardedGraph`:

- node tensors come in *owned* (``Shard(0)``, the partition's sizes) and are computed on in the
  *extended* layout (owned rows then ghost copies, see
  :mod:`meshshard.shardtensor.rules.graph_rows`);
- ``edge_index`` is a ``(2, E)`` ShardTensor sharded over each rank's local edges whose values
  are extended rows of the same rank, so ``h[edge_index[0]]`` and the aggregation are local;
- ``begin``/``before_layer`` refresh the ghosts (the only communication; differentiable);
- ``end`` returns the owned rows: a ShardTensor with the partition's sizes, so a loss over it
  (``.mean()``, ``.sum()``) is the global loss and a weight's ``.grad`` the global gradient.

This uses the aten-level class (``meshshard.shardtensor._aten``) until it replaces today's
ShardTensor; :class:`~meshshard.graph.GhostExchange` serves today's class.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard

from meshshard.graph.record import ShardedGraph
from meshshard.shardtensor._aten import from_local
from meshshard.shardtensor._aten.layout_args import comm_device
from meshshard.shardtensor.rules.graph_rows import (
    ghost_refresh,
    note_index_range,
    row_gather,
    row_scatter,
)
from meshshard.shardtensor.rules.graph_scatter import note_extended

__all__ = ["GraphPlug"]


def _all_sizes(counts: list[int], group: Any, world: int, device) -> list[tuple[int, ...]]:
    """Every rank's ``counts`` (one all-gather on the mesh's device, set-up only)."""
    if world == 1:
        return [(int(c),) for c in counts]
    t = torch.tensor(counts, dtype=torch.int64, device=device)
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t, group=group)
    table = torch.stack(out).tolist()
    return [tuple(int(row[i]) for row in table) for i in range(len(counts))]


class GraphPlug:
    """Message passing on ShardTensors over a :class:`ShardedGraph`.

    Parameters
    ----------
    graph : ShardedGraph
        This rank's piece (its ``group`` must be the mesh's group).
    mesh : DeviceMesh
        1-D, one coordinate per part, in part order.
    strategy : {"per_layer", "once"}
        As :class:`~meshshard.graph.GhostExchange`: a refresh before every layer, or one refresh
        of ``layers`` rings (needs ``graph.rings >= layers``).
    layers : int
        Message-passing layers of the model (checked for ``"once"``).
    device : torch.device, optional
        Where the plug's indices live; default the mesh's device (this rank's GPU on a CUDA
        mesh). Node and edge tensors must live there too.

    Notes
    -----
    Collective: the constructor (one all-gather of sizes), ``begin`` and ``before_layer``
    (and their backward). The indices are checked once, here, on the host arrays they are
    built from; a step then reads nothing back for them (no host sync).
    """

    def __init__(self, graph: ShardedGraph, mesh: Any, strategy: str = "per_layer",
                 layers: int = 1, *, device: Any = None) -> None:
        if strategy not in ("per_layer", "once"):
            msg = f"strategy={strategy!r} must be 'per_layer' or 'once'"
            raise ValueError(msg)
        if strategy == "once" and graph.rings < layers:
            msg = (f"strategy='once' with {layers} layers needs a graph with rings >= {layers}, "
                   f"this one has {graph.rings}; build it with rings={layers} or use 'per_layer'")
            raise ValueError(msg)
        if mesh.ndim != 1 or mesh.size(0) != graph.nparts or \
                mesh.get_local_rank(0) != graph.rank:
            msg = (f"GraphPlug: the mesh {tuple(mesh.shape)} (this rank at "
                   f"{mesh.get_coordinate()}) must be 1-D with one coordinate per part "
                   f"({graph.nparts}), this rank at its part {graph.rank}")
            raise ValueError(msg)
        self.graph, self.mesh, self.strategy, self.layers = graph, mesh, strategy, int(layers)
        self.device = comm_device(mesh) if device is None else torch.device(device)
        dev = self.device
        group, world = mesh.get_group(0), mesh.size(0)
        self.owned = tuple(int(v) for v in graph.sizes)
        self.extended, edges = _all_sizes([graph.n_local, graph.edge_index.shape[1]], group,
                                          world, comm_device(mesh))
        note_extended(mesh, self.owned, self.extended)  # batch statistics over it: refused
        self.edge_sizes = edges
        ext_off = sum(self.extended[: graph.rank])
        plan, r = graph.plan, graph.rank
        self._send_idx = torch.as_tensor(np.asarray(plan.send_idx[r], dtype=np.int64),
                                         device=dev)
        self._send = [int(c) for c in plan.send_counts(r)]
        self._recv = [int(c) for c in plan.recv_counts(r)]
        host_ei = graph.edge_index.detach().to("cpu", torch.int64)
        if host_ei.numel() and (int(host_ei.min()) < 0 or int(host_ei.max()) >= graph.n_local):
            msg = (f"GraphPlug: the graph's edge_index names rows {int(host_ei.min())}.."
                   f"{int(host_ei.max())}, outside this rank's {graph.n_local} local rows; "
                   "rebuild the ShardedGraph")
            raise ValueError(msg)
        ei = (host_ei + ext_off).to(dev)
        self.edge_index = from_local(ei, mesh, [Shard(1)], [edges], validate=False)
        for row in range(2):  # range known here: the layers' gathers read nothing back
            if host_ei.shape[1]:
                note_index_range(self.edge_index[row], int(host_ei[row].min()) + ext_off,
                                 int(host_ei[row].max()) + ext_off)
        rows = torch.arange(graph.n_owned, dtype=torch.int64, device=dev) + ext_off
        self._owned_rows = from_local(rows, mesh, [Shard(0)], [self.owned], validate=False)
        if graph.n_owned:
            note_index_range(self._owned_rows, ext_off, ext_off + graph.n_owned - 1)
        self._like = from_local(torch.empty((graph.n_local, 0), device=dev), mesh, [Shard(0)],
                                [self.extended], validate=False)
        self.refreshes = 0

    # ------------------------------------------------------------------ wrapping
    def nodes(self, local: torch.Tensor) -> Any:
        """This rank's owned-node rows as a ShardTensor (the partition's sizes)."""
        return from_local(local, self.mesh, [Shard(0)], [self.owned])

    def edges(self, local: torch.Tensor) -> Any:
        """Per-edge rows aligned to ``graph.edge_index`` as a ShardTensor."""
        return from_local(local, self.mesh, [Shard(0)], [self.edge_sizes])

    # ------------------------------------------------------------------ the plug protocol
    def _refresh(self, x: Any) -> Any:
        self.refreshes += 1
        return ghost_refresh(x, self._send_idx, self._send, self._recv, list(self.owned),
                             list(self.extended))

    def begin(self, x: Any) -> Any:
        """Owned node rows (a ShardTensor) -> the extended layout, ghosts fresh."""
        return self._refresh(x)

    def before_layer(self, h: Any, layer: int) -> Any:
        if self.strategy == "once" or layer == 0:
            return h
        return self._refresh(h)

    def aggregate(self, messages: Any, reduce: str = "sum") -> Any:
        """Per-edge messages reduced at the edges' targets: the extended layout (owned rows
        exact, ghost rows hold the in-edges held here)."""
        return row_scatter(messages, self.edge_index[1], self._like, reduce)

    def end(self, h: Any) -> Any:
        """The owned rows of an extended node tensor (the partition's sizes)."""
        return row_gather(h, self._owned_rows)
