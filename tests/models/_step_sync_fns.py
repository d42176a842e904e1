"""Rank functions for ``test_step_syncs.py``: host syncs of one warm training step (forward,
loss, backward) of MeshGraphNet on GraphPlug and of DoMINO on ShardTensors, counted by
:mod:`meshshard.testing.sync_census` (the second step: the first warms caches)."""

from __future__ import annotations

import torch


def _steps(step, n=2) -> tuple[int, str]:
    from meshshard.testing.sync_census import sync_census

    for _ in range(n - 1):
        step()
    with sync_census() as c:
        step()
    return c.total, c.report()


def meshgraphnet_plug(rank: int, world: int, layers: int) -> tuple[int, str]:
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.graph import GraphPlug
    from tests.graph._data import problem
    from tests.graph._fns import _graph
    from tests.shardtensor._graph_rows_fns import _model

    mesh = init_device_mesh("cpu", (world,))
    case = {"graph": "knn", "n": 120, "method": "hilbert"}
    prob = problem(case, world)
    g = _graph(case, prob, rank, world, 1)
    plug = GraphPlug(g, mesh, "per_layer", layers)
    mine = g.nodes[: g.n_owned]
    model = _model(layers, "sum")
    x = plug.nodes(torch.from_numpy(prob["x"][mine]).double())
    e = plug.edges(torch.from_numpy(g.local_edges(prob["edge_attr"])).double())
    w = plug.nodes(torch.from_numpy(prob["w"][mine]).double())

    def step():
        model.zero_grad(set_to_none=True)
        loss = ((model(x, e, plug) - w) ** 2).mean()
        loss.backward()

    return _steps(step)


def meshgraphnet_ghost(rank: int, world: int, layers: int, validate: str) -> tuple[int, str]:
    """MeshGraphNet on this rank's local tensors through GhostExchange."""
    from meshshard.graph import GhostExchange
    from tests.graph._data import problem
    from tests.graph._fns import _graph
    from tests.shardtensor._graph_rows_fns import _model

    case = {"graph": "knn", "n": 120, "method": "hilbert"}
    prob = problem(case, world)
    g = _graph(case, prob, rank, world, 1)
    plug = GhostExchange(g, "per_layer", layers, validate=validate)
    mine = g.nodes[: g.n_owned]
    model = _model(layers, "sum")
    x = torch.from_numpy(prob["x"][mine]).double()
    e = torch.from_numpy(g.local_edges(prob["edge_attr"])).double()
    w = torch.from_numpy(prob["w"][mine]).double()

    def step():
        model.zero_grad(set_to_none=True)
        ((model(x, e, plug) - w) ** 2).sum().backward()

    return _steps(step)


def domino(rank: int, world: int, grid: list[int] | None,
           validate: bool = True, backend: str = "auto", search: str = "forward"
           ) -> tuple[int, str]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    from meshshard.ops.domino_ops import ShardedDominoOps
    from meshshard.shardtensor import from_local
    from tests.models._domino_fns import data, model

    mesh = init_device_mesh("cpu", (world,))
    stl, pts, sdf, feat, target = data(60, 40, torch.float64)
    ops = ShardedDominoOps(mesh, grid, validate=validate, backend=backend, search=search)
    m = model(torch.float64, ops)
    rs = [len(range(60)[r::world]) for r in range(world)]
    ps = [len(range(40)[r::world]) for r in range(world)]

    def rows(t, sizes):
        off = sum(sizes[:rank])
        return from_local(t[off : off + sizes[rank]].clone(), mesh, [Shard(0)], [sizes])

    if grid is None:
        g = from_local(sdf, mesh, [Replicate()])
    else:
        g = from_local(sdf[sum(grid[:rank]) : sum(grid[: rank + 1])], mesh, [Shard(0)], [grid])
    args = (rows(stl, rs), g, rows(pts, ps), rows(feat, ps))
    t = rows(target, ps)

    def step():
        m.zero_grad(set_to_none=True)
        loss = ((m(*args) - t) ** 2).mean()
        loss.backward()

    return _steps(step)


def all_steps(rank: int, world: int) -> dict:
    """Every counted step in one spawn of ranks."""
    return {"meshgraphnet_plug": meshgraphnet_plug(rank, world, 4),
            # the device path: backend "grid" (the cell list), the default off the CPU
            "domino": domino(rank, world, [3, 3], validate=False, backend="grid"),
            "domino_validated": domino(rank, world, [3, 3], validate=True, backend="grid"),
            # the CPU default (cKDTree): more syncs, none of which a GPU run pays
            "domino_cpu_kernels": domino(rank, world, [3, 3], validate=False),
            # the static-shape search (everything all-gathered, brute-force kernel)
            "domino_gathered": domino(rank, world, [3, 3], validate=False, backend="brute",
                                      search="gathered"),
            "meshgraphnet_ghost": meshgraphnet_ghost(rank, world, 4, "always"),
            "meshgraphnet_ghost_unchecked": meshgraphnet_ghost(rank, world, 4, "never")}
