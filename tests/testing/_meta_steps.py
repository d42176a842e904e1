"""One training step of each model family on the meta device over a fake 2-rank process group,
under :class:`meshshard.testing.device_guard.DeviceGuard`: any tensor built on the host during
the step (a CPU tensor on a GPU run) raises with the meshshard line that made it.

Run as ``python -m tests.testing._meta_steps FAMILY...``; prints one JSON line
``{family: null | error text}`` (a process can join only one process group at a time, and each
family gets a fresh one).

Set-up outside the step may use the host (graphs are built from numpy at load time); what the
guard covers is the step: forward, loss and backward.
"""

from __future__ import annotations

import json
import sys
import traceback

import torch

META = torch.device("meta")
SIZES = [3, 5]  # rank 0's view of an uneven 2-rank layout


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("meta", (2,))


def _st(shape_local, mesh, dim, sizes, grad=False):
    from meshshard.shardtensor import Shard, from_local

    t = torch.empty(*shape_local, device=META, dtype=torch.float32, requires_grad=grad)
    return from_local(t, mesh, [Shard(dim)], [sizes], validate=False)


def transolver(guard):
    from meshshard.models import Transolver

    mesh = _mesh()
    with torch.device(META):
        model = Transolver(3, 2, 2, n_hidden=16, n_layers=2, heads=2, slices=8)
    c, f, t = (_st((1, SIZES[0], d), mesh, 1, SIZES) for d in (3, 2, 2))
    with guard:
        loss = ((model(c, f) - t) ** 2).mean()
        loss.backward()


def ring_attention(guard):
    import torch.nn.functional as F

    mesh = _mesh()
    q, k, v = (_st((2, 2, SIZES[0], 8), mesh, 2, SIZES, grad=True) for _ in range(3))
    with guard:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()


def grid_unet(guard):
    from meshshard.models import UNet3d

    mesh = _mesh()
    with torch.device(META):
        model = UNet3d(2, 3, base=4, depth=2, norm="group")
    x = _st((2, 2, 4, 8, 8), mesh, 2, [4, 4])
    with guard:
        model(x).pow(2).mean().backward()


def _graph_problem():
    """A 2-part graph built on the host (as at load time) and rank 0's piece of it."""
    from meshshard.graph import from_edge_index
    from tests.graph._data import problem

    prob = problem({"graph": "knn", "n": 40, "method": "hilbert"}, 2)
    return prob, from_edge_index(prob["partition"], prob["edge_index"],
                                 edge_attr=prob["edge_attr"], rings=1)


def meshgraphnet_plug(guard):
    from unittest import mock

    from meshshard.graph import GraphPlug, plug
    from meshshard.models import MeshGraphNet
    from tests.graph._data import EDGE_IN, NODE_IN, OUT

    mesh = _mesh()
    _, g = _graph_problem()
    # the constructor's size exchange moves nothing over a fake group: give it sizes (rank
    # 1 as large as rank 0; only this rank's shapes matter on meta)
    with mock.patch.object(plug, "_all_sizes", lambda counts, *a: [(c, c) for c in counts]):
        p = GraphPlug(g, mesh, "per_layer", 4, device=META)
    with torch.device(META):
        model = MeshGraphNet(NODE_IN, EDGE_IN, OUT, hidden=8, layers=4)
    from torch.distributed.tensor import Shard

    from meshshard.shardtensor._aten import from_local

    def rows(n, c, sizes):  # as p.nodes / p.edges, without their (value-reading) layout check
        return from_local(torch.empty(n, c, device=META), mesh, [Shard(0)], [list(sizes)],
                          validate=False)

    x = rows(g.n_owned, NODE_IN, p.owned)
    e = rows(g.edge_index.shape[1], EDGE_IN, p.edge_sizes)
    w = rows(g.n_owned, OUT, p.owned)
    with guard:
        ((model(x, e, p) - w) ** 2).mean().backward()


def meshgraphnet_ghost(guard):
    from meshshard.graph import GhostExchange
    from meshshard.models import MeshGraphNet
    from tests.graph._data import EDGE_IN, NODE_IN, OUT

    _, g = _graph_problem()
    g = g.to(META)
    plug = GhostExchange(g, "per_layer", 4, validate="never")  # no read-back
    with torch.device(META):
        model = MeshGraphNet(NODE_IN, EDGE_IN, OUT, hidden=8, layers=4)
    x = torch.empty(g.n_owned, NODE_IN, device=META)
    e = torch.empty(g.edge_index.shape[1], EDGE_IN, device=META)
    with guard:
        model(x, e, plug).pow(2).sum().backward()


def domino(guard):
    """DoMINO on ShardTensors with the sharded ops in their static-shape mode: the neighbour
    searches all-gather the points (``search="gathered"``, ``backend="brute"``; the exact
    forwarded kNN and the deduplicated gather size their exchanges from the data, a read-back
    by nature), and the loader, not the step, checks that the grid covers the points
    (``validate=False``)."""
    from meshshard.models.domino import DoMINO
    from meshshard.ops.domino_ops import ShardedDominoOps

    mesh = _mesh()
    ops = ShardedDominoOps(mesh, [4, 4], backend="brute", validate=False, search="gathered")
    with torch.device(META):
        model = DoMINO((8, 6, 6), point_features=3, ops=ops)
    stl, pts, feats = (_st((SIZES[0], 3), mesh, 0, SIZES) for _ in range(3))
    sdf = _st((4, 6, 6), mesh, 0, [4, 4])
    with guard:
        model(stl, sdf, pts, feats).pow(2).sum().backward()


def domino_local(guard):
    """DoMINO with its one-process ops (the model's own code: grid nodes, pooling, convs,
    sampling, basis aggregation)."""
    from meshshard.models.domino import DoMINO

    with torch.device(META):
        model = DoMINO((8, 6, 6), point_features=3)
    stl, pts, feats = (torch.empty(SIZES[0], 3, device=META) for _ in range(3))
    sdf = torch.empty(8, 6, 6, device=META)
    with guard:
        model(stl, sdf, pts, feats).pow(2).sum().backward()


def meshgraphnet_plug_host_indices(guard):
    """A plug whose indices stay on the host: the guard must catch it (it can fail)."""
    from unittest import mock

    from meshshard.graph import plug

    real = plug.GraphPlug.__init__

    def on_cpu(self, *a, device=None, **k):
        real(self, *a, device="cpu", **k)

    with mock.patch.object(plug.GraphPlug, "__init__", on_cpu):
        meshgraphnet_plug(guard)


def meshgraphnet_ghost_host_rows(guard):
    """GhostExchange with the plan's send rows left on the host: the guard must catch it."""
    from unittest import mock

    from meshshard.graph import _refresh

    real = _refresh.send_index
    with mock.patch.object(_refresh, "send_index", lambda p, r, d: real(p, r, "cpu")):
        meshgraphnet_ghost(guard)


def domino_host_padding(guard):
    """The gathered search with its padding built on the host: the guard must catch it."""
    from unittest import mock

    from meshshard.ops import _gathered

    def on_host(x, width):
        out = torch.zeros((width, *x.shape[1:]), dtype=x.dtype)
        out[: x.shape[0]] = x
        return out

    with mock.patch.object(_gathered, "_padded", on_host):
        domino(guard)


FAMILIES = {
    "transolver": transolver,
    "ring_attention": ring_attention,
    "grid_unet": grid_unet,
    "meshgraphnet_plug": meshgraphnet_plug,
    "meshgraphnet_ghost": meshgraphnet_ghost,
    "domino": domino,
    "domino_local": domino_local,
    "meshgraphnet_plug_host_indices": meshgraphnet_plug_host_indices,
    "meshgraphnet_ghost_host_rows": meshgraphnet_ghost_host_rows,
    "domino_host_padding": domino_host_padding,
}


def run(names) -> dict:
    from meshshard.testing.device_guard import DeviceGuard, fake_world

    out = {}
    for name in names:
        try:
            with fake_world(2, rank=0):
                FAMILIES[name](DeviceGuard(META))
            out[name] = None
        except Exception:
            out[name] = traceback.format_exc(limit=-6)
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1:] or list(FAMILIES))))
