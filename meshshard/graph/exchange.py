"""Message passing on a :class:`~meshshard.graph.ShardedGraph`: ghost refresh and aggregation.

- :func:`refresh_ghosts` fills the ghost rows from their owners with the same all-to-all as
  :func:`meshshard.ops.halo_exchange`, without its full-size temporaries (``_refresh.py``;
  differentiable: ghost gradients go back to the owners and are summed there).
- :func:`aggregate` reduces per-edge messages at the edges' targets, locally: by the edge
  ownership rule every owned node has all its in-edges here, so owners get exactly the
  single-process values, with no communication.
- :class:`GhostExchange` plugs both into a model written in plain torch (e.g.
  :class:`meshshard.models.MeshGraphNet`) with one of two strategies: a refresh before every
  layer (``"per_layer"``, 1 ring) or one refresh of ``L`` rings before ``L`` local layers
  (``"once"``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from meshshard.graph._refresh import refresh_owned, send_index
from meshshard.graph.record import ShardedGraph
from meshshard.ops._validation import check_reduce, collective_flag
from meshshard.ops.halo import scatter_rows
from meshshard.shardtensor import ShardTensor

__all__ = ["GhostExchange", "aggregate", "refresh_ghosts", "sync_gradients"]


def _local_of(x: Any, graph: ShardedGraph) -> tuple[torch.Tensor | None, str | None]:
    if isinstance(x, ShardTensor):
        from torch.distributed.tensor import Shard

        pl = x.placements
        if len(pl) != 1 or not isinstance(pl[0], Shard) or pl[0].dim != 0:
            return None, f"refresh_ghosts: a ShardTensor must be Shard(0) on a 1-D mesh, got {pl}"
        sizes = list(x.sharding_sizes())
        if sizes != graph.sizes.tolist():
            return None, (
                f"refresh_ghosts: the ShardTensor's sharding sizes {sizes} differ from the "
                f"graph's owned sizes {graph.sizes.tolist()}; redistribute it to the graph's "
                "partition sizes first"
            )
        return x.to_local(), None
    if not isinstance(x, torch.Tensor):
        return None, f"refresh_ghosts: expected a Tensor or ShardTensor, got {type(x).__name__}"
    return x, None


def refresh_ghosts(x: Any, graph: ShardedGraph, *, check: bool = True) -> torch.Tensor:
    """This rank's owned rows followed by fresh copies of its ghost rows.

    Collective: every rank of ``graph.group`` must call this (and ``backward`` when gradients
    flow).

    Parameters
    ----------
    x : Tensor of shape (n_owned, ...) or (n_local, ...), or ShardTensor
        Owned rows (the ghost rows of an ``n_local``-row tensor are ignored and replaced), or a
        ``Shard(0)`` ShardTensor with the graph's sharding sizes.
    graph : ShardedGraph
    check : bool
        Check collectively (one small all_reduce) that every rank's row count fits, so a
        mismatch raises on every rank instead of hanging.

    Returns
    -------
    Tensor of shape (n_local, ...)
        Differentiable: the gradients of ghost rows are summed into their owners' rows.

    Raises
    ------
    ValueError
        On every rank, when any rank's rows are neither ``n_owned`` nor ``n_owned + n_ghost``.
    """
    local, problem = _local_of(x, graph)
    rows_ok = local is not None and local.dim() >= 1
    rows_ok = rows_ok and local.shape[0] in (graph.n_owned, graph.n_local)
    if problem is None and not rows_ok:
        problem = (
            f"refresh_ghosts: rank {graph.rank} got {tuple(local.shape)} but its graph has "
            f"{graph.n_owned} owned + {graph.n_ghost} ghost nodes; pass {graph.n_owned} "
            f"(owned) or {graph.n_local} (owned + ghost) rows"
        )
    if check:
        dev = local.device if local is not None else torch.device("cpu")
        collective_flag(problem, group=graph.group, device=dev, op="refresh_ghosts")
    elif problem is not None:
        raise ValueError(problem)
    return refresh_owned(local[: graph.n_owned], graph.plan, graph.rank, graph.group)


def aggregate(
    messages: torch.Tensor,
    graph: ShardedGraph | torch.Tensor,
    reduce: str = "sum",
    *,
    num_rows: int | None = None,
) -> torch.Tensor:
    """Reduce per-edge ``messages`` at the edges' targets (local, no communication).

    Parameters
    ----------
    messages : Tensor of shape (E_local, ...)
        One row per local edge, in ``graph.edge_index`` order.
    graph : ShardedGraph, or a (2, E) edge_index with ``num_rows``
    reduce : {"sum", "mean", "max"}
        Rows without in-edges are 0 (PyG's convention).
    num_rows : int, optional
        Output rows (default ``graph.n_local``).

    Returns
    -------
    Tensor of shape (num_rows, ...)
        Owned rows equal the single-process aggregation over the whole graph. Ghost rows
        hold the in-edges present here (complete for ghosts closer than ``graph.rings``).
    """
    check_reduce(reduce)
    if isinstance(graph, ShardedGraph):
        edge_index = graph.edge_index
        rows = graph.n_local if num_rows is None else int(num_rows)
    else:
        edge_index = graph
        if num_rows is None:
            msg = "aggregate: pass num_rows= with a bare edge_index"
            raise ValueError(msg)
        rows = int(num_rows)
    if messages.dim() < 1 or messages.shape[0] != edge_index.shape[1]:
        msg = (
            f"aggregate: messages have {tuple(messages.shape)} but the graph has "
            f"{edge_index.shape[1]} local edges; give one row per local edge"
        )
        raise ValueError(msg)
    return scatter_rows(messages, edge_index[1].to(messages.device), rows, reduce)


class GhostExchange:
    """The message-passing plug of a plain-torch graph model, backed by a ShardedGraph.

    Implements the protocol of :class:`meshshard.models.meshgraphnet.FullGraph`:
    ``edge_index``, ``begin(x)``, ``before_layer(h, i)``, ``aggregate(messages, reduce)``,
    ``end(h)``.

    Parameters
    ----------
    graph : ShardedGraph
    strategy : {"per_layer", "once"}
        ``"per_layer"``: ghosts refreshed before every layer but the first (the first layer's
        ghost rows were computed locally from refreshed inputs); any ``rings``.
        ``"once"``: inputs refreshed once, then ``layers`` local layers; needs
        ``graph.rings >= layers``, trading more ghost rows and redundant compute for
        ``layers - 1`` fewer exchanges.
    layers : int
        Message-passing layers of the model (checked for ``"once"``).
    validate : {"always", "once", "never"} or bool
        The collective input check of ``begin`` (one small all-reduce and one host sync: a
        rank whose rows do not fit the graph raises on every rank instead of hanging).
        ``"always"`` (``True``, the default) checks every step; ``"once"`` checks the first
        ``begin`` only (a training loop whose inputs keep their shapes); ``"never"``
        (``False``) only checks this rank's rows locally, so a bad rank raises alone and the
        others wait in the exchange: a hot path with no host sync (and one that runs on the
        meta device).

    Notes
    -----
    Collective: ``begin`` and ``before_layer`` (and their backward) are collective.
    """

    def __init__(self, graph: ShardedGraph, strategy: str = "per_layer", layers: int = 1,
                 *, validate: bool | str = True):
        modes = {True: "always", False: "never", "always": "always", "once": "once",
                 "never": "never"}
        if not isinstance(validate, (bool, str)) or validate not in modes:
            msg = (f"GhostExchange: validate={validate!r} must be 'always', 'once', 'never' "
                   "(or True / False)")
            raise ValueError(msg)
        if strategy not in ("per_layer", "once"):
            msg = f"strategy={strategy!r} must be 'per_layer' or 'once'"
            raise ValueError(msg)
        if strategy == "once" and graph.rings < layers:
            msg = (
                f"strategy='once' with {layers} layers needs a graph with rings >= {layers}, "
                f"this one has {graph.rings}; build it with rings={layers} or use 'per_layer'"
            )
            raise ValueError(msg)
        self.graph = graph
        self.strategy = strategy
        self.layers = int(layers)
        self.edge_index = graph.edge_index
        self.refreshes = 0
        self.validate = modes[validate]
        self._checked = False
        # the plan's send rows go to the graph's device now, not in the first step
        send_index(graph.plan, graph.rank, graph.edge_index.device)

    def begin(self, x: Any) -> torch.Tensor:
        self.refreshes += 1
        check = self.validate == "always" or (self.validate == "once" and not self._checked)
        self._checked = True
        return refresh_ghosts(x, self.graph, check=check)

    def before_layer(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        if self.strategy == "once" or layer == 0:
            return h
        self.refreshes += 1
        return refresh_ghosts(h, self.graph, check=False)

    def aggregate(self, messages: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        return aggregate(messages, self.graph, reduce)

    def end(self, h: torch.Tensor) -> torch.Tensor:
        return h[: self.graph.n_owned]


def sync_gradients(params: Iterable[torch.nn.Parameter], group: Any = None) -> None:
    """Sum the gradients of replicated parameters over the ranks (one all_reduce each).

    After a backward of a loss that is a sum over owned nodes (divided by the *global* count
    for a mean), the summed gradients equal the single-process gradients.

    Collective: every rank of ``group`` must call this, with the same parameters.
    """
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    start = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[start : start + n].view_as(p.grad))
        start += n
