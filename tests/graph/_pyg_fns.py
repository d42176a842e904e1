"""Rank functions for ``test_pyg_plug.py``: unmodified PyG layers (``GraphConv``, ``SAGEConv``)
on ShardTensors through :class:`meshshard.graph.GraphPlug`, against the same model on the whole
graph in one process (fp64). No gradient sync and no loss scaling anywhere."""

from __future__ import annotations

import torch

from tests.graph._data import NODE_IN, OUT, problem

HIDDEN = 6
STEPS = 3


class Net(torch.nn.Module):
    """Two PyG convolutions; with a plug: ``begin`` / ``before_layer`` / ``end`` around them."""

    def __init__(self, kind: str, aggr: str) -> None:
        from torch_geometric.nn import GraphConv, SAGEConv

        super().__init__()
        self.kind = kind
        if kind == "graph":
            self.c1, self.c2 = GraphConv(NODE_IN, HIDDEN, aggr), GraphConv(HIDDEN, OUT, aggr)
        else:
            self.c1 = SAGEConv(NODE_IN, HIDDEN, aggr, project=True)
            self.c2 = SAGEConv(HIDDEN, OUT, aggr, normalize=True)

    def _conv(self, conv, h, edge_index, weight):
        if self.kind == "graph":
            return conv(h, edge_index, weight)
        return conv(h, edge_index)

    def forward(self, x, edge_index, weight=None, plug=None):
        h = plug.begin(x) if plug is not None else x
        h = self._conv(self.c1, h, edge_index, weight).tanh()
        if plug is not None:
            h = plug.before_layer(h, 1)
        h = self._conv(self.c2, h, edge_index, weight)
        return plug.end(h) if plug is not None else h


def _net(kind: str, aggr: str) -> Net:
    torch.manual_seed(0)
    return Net(kind, aggr).to(torch.float64)


def _run(model, x, ei, weight, w, plug=None) -> dict:
    """Loss, input and weight gradients, then ``STEPS`` plain SGD steps (losses, weights)."""
    out = model(x, ei, weight, plug)
    loss = ((out - w) ** 2).mean()  # on ShardTensors: the global mean, no scaling by hand
    gx, = torch.autograd.grad(loss, x, retain_graph=True)
    gw = torch.autograd.grad(loss, list(model.parameters()))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    for _ in range(STEPS):  # no sync_gradients: .grad is already the global gradient
        opt.zero_grad(set_to_none=True)
        step_loss = ((model(x, ei, weight, plug) - w) ** 2).mean()
        step_loss.backward()
        opt.step()
        losses.append(step_loss.detach())
    return {"out": out.detach(), "loss": loss.detach(), "gx": gx, "gw": gw, "losses": losses,
            "weights": [p.detach().clone() for p in model.parameters()]}


def _reference(prob, kind, aggr) -> dict:
    x = torch.from_numpy(prob["x"]).double().requires_grad_()
    ei = torch.from_numpy(prob["edge_index"])
    weight = torch.from_numpy(prob["messages"][:, 0]).double()
    w = torch.from_numpy(prob["w"]).double()
    return _run(_net(kind, aggr), x, ei, weight, w)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def pyg_cases(rank: int, P: int, cases: list[dict]) -> list[dict]:
    """Per case, per (layer kind, aggregation, strategy): (got, want) pairs by name."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.graph import GraphPlug
    from tests.graph._fns import _graph

    mesh = init_device_mesh("cpu", (P,))
    results = []
    for case in cases:
        prob = problem(case, P)
        res = {}
        for kind, aggr in case["layers"]:
            ref = _reference(prob, kind, aggr)
            for strategy in ("per_layer", "once"):
                g = _graph(case, prob, rank, P, 1 if strategy == "per_layer" else 2)
                plug = GraphPlug(g, mesh, strategy, 2)
                mine = g.nodes[: g.n_owned]
                x = plug.nodes(torch.from_numpy(prob["x"][mine]).double()).requires_grad_()
                weight = plug.edges(torch.from_numpy(g.local_edges(prob["messages"][:, 0]))
                                    .double())
                w = plug.nodes(torch.from_numpy(prob["w"][mine]).double())
                got = _run(_net(kind, aggr), x, plug.edge_index, weight, w, plug)
                pairs = {
                    "out": (got["out"].to_local(), ref["out"][mine]),
                    "loss": (_full(got["loss"]), ref["loss"]),
                    "grad x": (got["gx"].to_local(), ref["gx"][mine]),
                    **{f"grad w{k}": (a, b) for k, (a, b) in enumerate(zip(got["gw"],
                                                                           ref["gw"]))},
                    **{f"step {k} loss": (_full(a), b)
                       for k, (a, b) in enumerate(zip(got["losses"], ref["losses"]))},
                    **{f"trained w{k}": (a, b)
                       for k, (a, b) in enumerate(zip(got["weights"], ref["weights"]))},
                    "plain grads": all(type(p) is torch.Tensor for p in got["gw"]),
                }
                res[kind, aggr, strategy] = pairs
        results.append(res)
    return results


def _zoo() -> dict:
    """More unmodified PyG layers (in -> OUT), each exercising other ops of the scatter path."""
    import torch_geometric.nn as G
    from torch.nn import Linear, ReLU, Sequential

    return {
        "GATConv": lambda: G.GATConv(NODE_IN, OUT, heads=2, concat=False,
                                     add_self_loops=False),
        "GATv2Conv": lambda: G.GATv2Conv(NODE_IN, OUT, heads=2, concat=False,
                                     add_self_loops=False),
        "TransformerConv": lambda: G.TransformerConv(NODE_IN, OUT, heads=2, concat=False),
        "GINConv": lambda: G.GINConv(Sequential(Linear(NODE_IN, 5), ReLU(), Linear(5, OUT))),
        "EdgeConv": lambda: G.EdgeConv(Sequential(Linear(2 * NODE_IN, OUT)), aggr="max"),
        "ResGatedGraphConv": lambda: G.ResGatedGraphConv(NODE_IN, OUT),
        "GENConv": lambda: G.GENConv(NODE_IN, OUT, norm=None, learn_t=True),
        "GCNConv": lambda: G.GCNConv(NODE_IN, OUT, add_self_loops=False, normalize=False),
        "SAGEConv min": lambda: G.SAGEConv(NODE_IN, OUT, aggr="min"),
        "SAGEConv mul": lambda: G.SAGEConv(NODE_IN, OUT, aggr="mul"),
        "SAGEConv std": lambda: G.SAGEConv(NODE_IN, OUT, aggr="std"),
        "SAGEConv mean+max": lambda: G.SAGEConv(NODE_IN, OUT, aggr=["mean", "max"]),
    }


def _one_layer(make, x, ei, w, plug=None):
    torch.manual_seed(0)
    conv = make().to(torch.float64)
    h = plug.begin(x) if plug is not None else x
    out = conv(h, ei)
    out = plug.end(out) if plug is not None else out
    loss = ((out - w) ** 2).mean()
    gx, = torch.autograd.grad(loss, x, retain_graph=True)
    gw = torch.autograd.grad(loss, list(conv.parameters()))
    return out.detach(), loss.detach(), gx, gw


def zoo_case(rank: int, P: int, case: dict) -> dict:
    """Per layer of :func:`_zoo`: (got, want) pairs of the output, loss and gradients."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.graph import GraphPlug
    from tests.graph._fns import _graph

    mesh = init_device_mesh("cpu", (P,))
    prob = problem(case, P)
    g = _graph(case, prob, rank, P, 1)
    plug = GraphPlug(g, mesh)
    mine = g.nodes[: g.n_owned]
    xr = torch.from_numpy(prob["x"]).double().requires_grad_()
    wr = torch.from_numpy(prob["w"]).double()
    out = {}
    for name, make in _zoo().items():
        r_out, r_loss, r_gx, r_gw = _one_layer(make, xr, torch.from_numpy(prob["edge_index"]),
                                               wr)
        x = plug.nodes(torch.from_numpy(prob["x"][mine]).double()).requires_grad_()
        w = plug.nodes(torch.from_numpy(prob["w"][mine]).double())
        s_out, s_loss, s_gx, s_gw = _one_layer(make, x, plug.edge_index, w, plug)
        out[name] = {"out": (s_out.to_local(), r_out[mine]), "loss": (_full(s_loss), r_loss),
                     "grad x": (s_gx.to_local(), r_gx[mine]),
                     **{f"grad w{k}": (a, b) for k, (a, b) in enumerate(zip(s_gw, r_gw))}}
    return out


def refusals(rank: int, P: int, case: dict) -> dict:
    """Layers whose PyG code the rules do not cover: the error each raises (clear, not a
    silently different result)."""
    import torch_geometric.nn as G
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.graph import GraphPlug
    from tests.graph._fns import _graph

    mesh = init_device_mesh("cpu", (P,))
    prob = problem(case, P)
    g = _graph(case, prob, rank, P, 1)
    plug = GraphPlug(g, mesh)
    x = plug.nodes(torch.from_numpy(prob["x"][g.nodes[: g.n_owned]]).double())
    layers = {
        "owned layout": (lambda: G.GraphConv(NODE_IN, OUT), False),
        "batch norm": (lambda: G.GENConv(NODE_IN, OUT), True),  # its MLP's BatchNorm
        "self loops": (lambda: G.GCNConv(NODE_IN, OUT), True),  # a boolean-mask edge filter
        "gcn_norm": (lambda: G.GCNConv(NODE_IN, OUT, add_self_loops=False), True),
    }
    out = {}
    for name, (make, begin) in layers.items():
        torch.manual_seed(0)
        conv = make().to(torch.float64)
        try:
            conv(plug.begin(x) if begin else x, plug.edge_index)
        except (ValueError, NotImplementedError) as e:
            out[name] = f"{type(e).__name__}: {e}"
        else:
            out[name] = "no error"
    return out


def compile_case(rank: int, P: int, case: dict) -> dict:
    """Plain ``torch.compile`` of the two-layer GraphConv model with the plug: graph breaks,
    and the compiled loss and weight gradients against eager."""

    import torch._dynamo as dynamo
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.graph import GraphPlug
    from meshshard.testing.inductor import private_inductor_cache
    from tests.graph._fns import _graph

    private_inductor_cache()
    mesh = init_device_mesh("cpu", (P,))
    prob = problem(case, P)
    g = _graph(case, prob, rank, P, 1)
    plug = GraphPlug(g, mesh)
    mine = g.nodes[: g.n_owned]
    x = plug.nodes(torch.from_numpy(prob["x"][mine]).double())
    weight = plug.edges(torch.from_numpy(g.local_edges(prob["messages"][:, 0])).double())
    w = plug.nodes(torch.from_numpy(prob["w"][mine]).double())
    from meshshard.shardtensor.rules import graph_scatter

    graph_scatter._NODE_LAYOUTS.clear()  # earlier eager cases of this spawn recorded the layout:
    graph_scatter._INDEX_LAYOUTS.clear()  # the compiled run must record it itself
    model = _net("graph", "add")
    out = {}
    for name, fn in (("compiled", torch.compile(model, backend="aot_eager")), ("eager", model)):
        model.zero_grad(set_to_none=True)
        loss = ((fn(x, plug.edge_index, weight, plug) - w) ** 2).mean()
        loss.backward()
        out[name] = [loss.full_tensor().detach()] + [p.grad.clone() for p in model.parameters()]
    dynamo.reset()
    out["graph breaks"] = dynamo.explain(model)(x, plug.edge_index, weight,
                                                plug).graph_break_count
    dynamo.reset()
    return out
