"""Rank functions for ``test_graph_rows.py``: a MeshGraphNet on ShardTensors through
:class:`meshshard.graph.GraphPlug` (autograd on the wrapper: no gradient sync, no loss scaling)
against one process on the whole graph, fp64."""

from __future__ import annotations

import torch

from tests.graph._data import EDGE_IN, NODE_IN, OUT, problem

HIDDEN = 8


def _model(layers: int, reduce: str):
    from meshshard.models import MeshGraphNet

    torch.manual_seed(0)
    return MeshGraphNet(NODE_IN, EDGE_IN, OUT, hidden=HIDDEN, layers=layers,
                        aggr=reduce).to(torch.float64)


def _reference(prob, layers, reduce):
    from meshshard.models import FullGraph

    model = _model(layers, reduce)
    n = prob["x"].shape[0]
    x = torch.from_numpy(prob["x"]).double().requires_grad_()
    ei = torch.from_numpy(prob["edge_index"])
    out = model(x, torch.from_numpy(prob["edge_attr"]).double(), FullGraph(ei, n))
    w = torch.from_numpy(prob["w"]).double()
    loss = ((out - w) ** 2).mean()
    gx, = torch.autograd.grad(loss, x, create_graph=True)
    gw = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
    ggx, = torch.autograd.grad((gx ** 2).sum(), x)
    return out.detach(), loss.detach(), gx.detach(), gw, ggx


def graph_cases(rank: int, P: int, cases: list[dict]) -> list[dict]:
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.graph import GraphPlug
    from tests.graph._fns import _graph

    mesh = init_device_mesh("cpu", (P,))
    results = []
    for case in cases:
        prob = problem(case, P)
        layers = case.get("layers", 2)
        res = {}
        for reduce in case.get("reduces", ("sum", "mean", "max")):
            ref_out, ref_loss, ref_gx, ref_gw, ref_ggx = _reference(prob, layers, reduce)
            for strategy in ("per_layer", "once"):
                g = _graph(case, prob, rank, P, 1 if strategy == "per_layer" else layers)
                plug = GraphPlug(g, mesh, strategy, layers)
                mine = g.nodes[: g.n_owned]
                model = _model(layers, reduce)
                x = plug.nodes(torch.from_numpy(prob["x"][mine]).double()).detach() \
                    .requires_grad_()
                e = plug.edges(torch.from_numpy(g.local_edges(prob["edge_attr"])).double())
                w = plug.nodes(torch.from_numpy(prob["w"][mine]).double())
                out = model(x, e, plug)
                loss = ((out - w) ** 2).mean()  # the global mean: no scaling by hand
                gx, = torch.autograd.grad(loss, x, create_graph=True)
                gw = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
                ggx, = torch.autograd.grad((gx ** 2).sum(), x)
                res[reduce, strategy] = {
                    "out": (out.to_local().detach(), ref_out[mine]),
                    "loss": (loss.full_tensor().detach(), ref_loss),
                    "grad x": (gx.to_local().detach(), ref_gx[mine]),
                    "2nd order x": (ggx.to_local(), ref_ggx[mine]),
                    **{f"grad w{k}": (a, b) for k, (a, b) in enumerate(zip(gw, ref_gw))},
                    "refreshes": plug.refreshes,
                }
        results.append(res)
    return results


def compile_case(rank: int, P: int, case: dict) -> dict:
    """Plain torch.compile(model) with the plug: graph breaks, and equal to eager."""

    import torch._dynamo as dynamo
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.graph import GraphPlug
    from meshshard.testing.inductor import private_inductor_cache
    from tests.graph._fns import _graph

    private_inductor_cache()
    mesh = init_device_mesh("cpu", (P,))
    prob = problem(case, P)
    g = _graph(case, prob, rank, P, 1)
    plug = GraphPlug(g, mesh, "per_layer", 2)
    mine = g.nodes[: g.n_owned]
    model = _model(2, "sum")
    x = plug.nodes(torch.from_numpy(prob["x"][mine]).double())
    e = plug.edges(torch.from_numpy(g.local_edges(prob["edge_attr"])).double())
    w = plug.nodes(torch.from_numpy(prob["w"][mine]).double())
    dynamo.reset()
    explain = dynamo.explain(model)(x, e, plug)
    dynamo.reset()
    out = {"graph breaks": explain.graph_break_count}
    for name, fn in (("eager", model), ("compiled", torch.compile(model, backend="aot_eager"))):
        model.zero_grad(set_to_none=True)
        loss = ((fn(x, e, plug) - w) ** 2).mean()
        loss.backward()
        out[name] = [loss.full_tensor().detach()] + [p.grad.clone() for p in model.parameters()]
    return out
