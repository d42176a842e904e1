"""Rank functions of the graph tests: every case of one world size in one spawn of ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.graph._data import EDGE_IN, NODE_IN, OUT, problem

HIDDEN = 8
#: a real OpenFOAM export (tests/data/foam_refined/make.sh): 158 hexahedra, 18 polyhedra
POLY_FILE = str(Path(__file__).resolve().parents[1] / "data" / "foam_refined" / "internal.vtu")


def _graph(case: dict, prob: dict, rank: int, P: int, rings: int):
    from meshshard.graph import build_graph, from_edge_index

    ei, attr, part = prob["edge_index"], prob["edge_attr"], prob["partition"]
    if case.get("build", "slices") == "full":
        return from_edge_index(part, ei, edge_attr=attr, rings=rings)
    # each rank reads one slice of a shuffled global edge list: edges must be routed
    perm = np.random.default_rng(3).permutation(ei.shape[1])
    mine = np.array_split(perm, P)[rank]
    return build_graph(part, ei[0, mine], ei[1, mine], edge_ids=mine, edge_attr=attr[mine],
                       rings=rings, symmetric=case.get("symmetric", True))  # fmt: skip


def _grads(model: torch.nn.Module) -> dict:
    return {k: p.grad.detach().numpy().copy() for k, p in model.named_parameters()}


def model_run(prob: dict, plug, x_in, edge_attr, reduce: str, layers: int, owned_nodes):
    from meshshard.models import MeshGraphNet

    torch.manual_seed(0)
    model = MeshGraphNet(NODE_IN, EDGE_IN, OUT, hidden=HIDDEN, layers=layers, aggr=reduce)
    out = model(x_in, edge_attr, plug)
    loss = (out * torch.from_numpy(prob["w"][owned_nodes])).sum()
    loss.backward()
    return model, out, loss


def oracle_cases(rank: int, P: int, cases: list[dict]) -> list[dict]:
    from meshshard.graph import GhostExchange, aggregate, refresh_ghosts, sync_gradients

    results = []
    for case in cases:
        prob = problem(case, P)
        layers = case.get("layers", 2)
        g1 = _graph(case, prob, rank, P, 1)
        gk = _graph(case, prob, rank, P, layers)
        res: dict = {"nodes": g1.nodes, "n_owned": g1.n_owned, "edge_ids": g1.edge_ids,
                     "n_owned_edges": g1.n_owned_edges, "nodes_k": gk.nodes,
                     "n_owned_edges_k": gk.n_owned_edges, "edge_ids_k": gk.edge_ids,
                     "depth_k": gk.ghost_depth, "moved": g1.ghost_rows_moved(),
                     "moved_k": gk.ghost_rows_moved()}  # fmt: skip
        want_attr = gk.local_edges(prob["edge_attr"])
        res["attr_ok"] = bool(np.array_equal(gk.edge_attr.numpy(), want_attr))
        # refresh: values and gradients (each copy of node v weighted by (1 + rank))
        x_owned = torch.from_numpy(prob["x"][g1.nodes[: g1.n_owned]]).requires_grad_()
        y = refresh_ghosts(x_owned, g1)
        (y * torch.from_numpy(prob["w"][g1.nodes, :1]) * (1 + rank)).sum().backward()
        res["refreshed"] = y.detach().numpy()
        res["refresh_grad"] = x_owned.grad.numpy()
        # aggregate at owned nodes
        msgs = torch.from_numpy(g1.local_edges(prob["messages"]))
        res["agg"] = {
            r: aggregate(msgs, g1, r)[: g1.n_owned].numpy() for r in ("sum", "mean", "max")
        }
        # the model, both strategies, every reduction
        res["model"] = {}
        for reduce in case.get("reduces", ("sum", "mean", "max")):
            for strategy, g in (("per_layer", g1), ("once", gk)):
                plug = GhostExchange(g, strategy, layers)
                xin = torch.from_numpy(prob["x"][g.nodes[: g.n_owned]])
                model, out, loss = model_run(prob, plug, xin, g.edge_attr, reduce, layers,
                                             g.nodes[: g.n_owned])  # fmt: skip
                sync_gradients(model.parameters())
                res["model"][reduce, strategy] = {
                    "out": out.detach().numpy(), "grads": _grads(model),
                    "refreshes": plug.refreshes,
                }  # fmt: skip
        # a layer's refresh after the first: no host sync (the plan's rows stay on the device)
        from meshshard.testing.sync_census import sync_census

        plug = GhostExchange(g1, "per_layer", 2)
        h = plug.begin(torch.from_numpy(prob["x"][g1.nodes[: g1.n_owned]]))
        with sync_census() as census:
            plug.before_layer(h, 1)
        res["layer_syncs"] = census.report() if census.total else 0
        # begin's collective input check: every step, the first step only, or never
        x0 = torch.from_numpy(prob["x"][g1.nodes[: g1.n_owned]])
        res["begin_syncs"] = {}
        for mode in ("always", "once", "never"):
            plug = GhostExchange(g1, "per_layer", 2, validate=mode)
            with sync_census() as first:
                plug.begin(x0)
            with sync_census() as second:
                y = plug.begin(x0)
            res["begin_syncs"][mode] = (first.total, second.total)
            np.testing.assert_array_equal(y.numpy(), prob["x"][g1.nodes])
        results.append(res)
    return results


def shardtensor_case(rank: int, P: int, case: dict) -> dict:
    """refresh_ghosts on a ShardTensor input, and a ShardTensor with the wrong sizes."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.graph import refresh_ghosts
    from meshshard.shardtensor import Shard, from_local

    prob = problem(case, P)
    g = _graph(case, prob, rank, P, 1)
    mesh = init_device_mesh("cpu", (P,))
    local = torch.from_numpy(prob["x"][g.nodes[: g.n_owned]])
    st = from_local(local, mesh, [Shard(0)], sharding_shapes=g.sizes.tolist())
    out = {"refreshed": refresh_ghosts(st, g).numpy(), "nodes": g.nodes}
    sizes = g.sizes.tolist()
    wrong = st.redistribute(sizes=[sum(sizes)] + [0] * (P - 1)) if sizes[0] != sum(sizes) else None
    try:
        refresh_ghosts(wrong if wrong is not None else local[:0], g)
        out["error"] = None
    except ValueError as exc:
        out["error"] = str(exc)
    return out


def bad_input_cases(rank: int, P: int) -> dict:
    """Each bad input must raise on every rank (no hang); the group stays usable after."""
    from meshshard.graph import build_graph, from_adjacency, refresh_ghosts
    from meshshard.partition import partition

    errors = {}
    case = {"graph": "knn", "n": 40}
    prob = problem(case, P)
    ei, part = prob["edge_index"], prob["partition"]
    mine = np.array_split(np.arange(ei.shape[1]), P)[rank]

    def attempt(name, fn):
        try:
            fn()
            errors[name] = None
        except (ValueError, TypeError) as exc:
            errors[name] = str(exc)

    def outside():
        src, dst = ei[0, mine].copy(), ei[1, mine].copy()
        if rank == P - 1:
            dst[-1] = 40  # one edge on one rank points past the last node
        build_graph(part, src, dst, edge_ids=mine)

    attempt("outside", outside)

    def negative():
        src = ei[0, mine].copy()
        if rank == 0:
            src[0] = -1
        build_graph(part, src, ei[1, mine], edge_ids=mine)

    attempt("negative", negative)

    def count_mismatch():
        from_adjacency(part, __import__("scipy.sparse").sparse.eye(41, format="csr"))

    attempt("count_mismatch", count_mismatch)

    def parts_mismatch():
        build_graph(partition(prob["pos"], P + 1), ei[0, mine], ei[1, mine], edge_ids=mine)

    attempt("parts_mismatch", parts_mismatch)

    def not_symmetric():
        dprob = problem({"graph": "directed", "n": 40}, P)
        d = dprob["edge_index"]
        dm = np.array_split(np.arange(d.shape[1]), P)[rank]
        build_graph(dprob["partition"], d[0, dm], d[1, dm], edge_ids=dm, symmetric=True)

    attempt("not_symmetric", not_symmetric)

    def twice():
        # rank 0 also gives rank 1's first edge: one edge given twice
        m = np.concatenate([mine, np.array_split(np.arange(ei.shape[1]), P)[1][:1]]) \
            if rank == 0 else mine  # fmt: skip
        build_graph(part, ei[0, m], ei[1, m], edge_ids=m)

    attempt("twice", twice)
    g = build_graph(part, ei[0, mine], ei[1, mine], edge_ids=mine)

    def rows():
        x = torch.zeros(g.n_owned + (1 if rank == 0 else 0) + g.n_ghost * (rank == 0), 3)
        refresh_ghosts(x, g)

    attempt("rows", rows)
    # the group still works: a correct refresh after all the failures
    y = refresh_ghosts(torch.from_numpy(prob["x"][g.nodes[: g.n_owned]]), g)
    errors["after_ok"] = bool(np.array_equal(y.numpy(), prob["x"][g.nodes]))
    return errors


def pyg_layers(kind: str):
    """Two unmodified PyG layers of one kind (same seed everywhere)."""
    from torch_geometric.nn import EdgeConv, GCNConv, GraphConv

    torch.manual_seed(0)
    if kind == "gcn":
        return GCNConv(NODE_IN, 8), GCNConv(8, OUT)
    if kind == "gcn_norm":  # same parameters as "gcn"; weights from meshshard.graph.gcn_norm
        return GCNConv(NODE_IN, 8, normalize=False), GCNConv(8, OUT, normalize=False)
    if kind == "graphconv":
        return GraphConv(NODE_IN, 8, aggr="mean"), GraphConv(8, OUT)
    if kind == "edgeconv":
        mlp1 = torch.nn.Sequential(torch.nn.Linear(2 * NODE_IN, 8), torch.nn.ReLU())
        mlp2 = torch.nn.Sequential(torch.nn.Linear(16, OUT))
        return EdgeConv(mlp1, aggr="max"), EdgeConv(mlp2, aggr="max")
    raise ValueError(kind)


#: ghost rings each layer kind needs for exact owned outputs with a refresh per layer
PYG_RINGS = {"gcn": 2, "gcn_norm": 1, "graphconv": 1, "edgeconv": 1}


def pyg_forward(layers, x, edge_index, refresh, owned, weight=None):
    extra = () if weight is None else (weight,)
    h = torch.relu(layers[0](refresh(x), edge_index, *extra))
    return layers[1](refresh(owned(h)), edge_index, *extra)


def pyg_cases(rank: int, P: int, case: dict) -> dict:
    from meshshard.graph import gcn_norm, refresh_ghosts, sync_gradients

    prob = problem(case, P)
    out = {}
    for kind, rings in PYG_RINGS.items():
        g = _graph(case, prob, rank, P, rings)
        layers = pyg_layers(kind)
        x = torch.from_numpy(prob["x"][g.nodes[: g.n_owned]])
        ei, w = gcn_norm(g) if kind == "gcn_norm" else (g.edge_index, None)
        y = pyg_forward(layers, x, ei, lambda h, g=g: refresh_ghosts(h, g),
                        g.owned, w)[: g.n_owned]  # fmt: skip
        (y * torch.from_numpy(prob["w"][g.nodes[: g.n_owned]])).sum().backward()
        params = [p for m in layers for p in m.parameters()]
        sync_gradients(params)
        out[kind] = {"out": y.detach().numpy(), "nodes": g.nodes[: g.n_owned],
                     "grads": [p.grad.numpy().copy() for p in params]}  # fmt: skip
    return out


def dual_from_cells(rank: int, P: int, cells: int) -> dict:
    """The dual graph built from each rank's own cells against the whole-mesh dual graph."""
    from meshshard.datasets.synthetic import car_body
    from meshshard.graph import from_adjacency, from_cells
    from meshshard.io.geometry import cell_centres
    from meshshard.partition import dual_graph, partition

    points, offsets, conn = car_body(cells)
    types = np.where(np.diff(offsets) == 4, 9, 5)
    adj = dual_graph(cells=conn, offsets=offsets, celltypes=types)
    part = partition(cell_centres(points, offsets, conn), P, method="metis", graph=adj)
    mine = part.shard_rows(rank)
    counts = np.diff(offsets)[mine]
    my_off = np.concatenate([[0], np.cumsum(counts)])
    my_conn = np.concatenate([conn[offsets[c] : offsets[c + 1]] for c in mine])
    out = {}
    for name, g in (
        ("cells", from_cells(part, mine, my_conn, offsets=my_off, celltypes=types[mine], rings=2)),
        ("whole", from_adjacency(part, adj, rings=2)),
    ):
        ei = g.nodes[g.edge_index.numpy()]
        out[name] = {"nodes": g.nodes, "depth": g.ghost_depth, "n_owned_edges": g.n_owned_edges,
                     "owned": {tuple(e) for e in ei[:, : g.n_owned_edges].T.tolist()},
                     "all": {tuple(e) for e in ei.T.tolist()}}  # fmt: skip
    return out


def dual_polyhedra_from_cells(rank: int, P: int) -> dict:
    """:func:`dual_from_cells` on a real OpenFOAM export with split-hex polyhedra: each rank
    passes its cells' connectivity and polyhedron faces only (a polyhedron's 5- and 6-point
    faces meet another rank's polyhedra)."""
    import pyvista as pv

    from meshshard.graph import from_adjacency, from_cells
    from meshshard.partition import dual_graph, partition
    from meshshard.partition.graph import mesh_connectivity, mesh_polyhedra
    from meshshard.partition.io import cell_centers

    mesh = pv.read(POLY_FILE)
    conn, offsets, types = mesh_connectivity(mesh)
    poly = mesh_polyhedra(mesh)
    adj = dual_graph(mesh)
    part = partition(cell_centers(mesh), P, method="rcb")  # cuts through the polyhedra
    mine = part.shard_rows(rank)
    counts = np.diff(offsets)[mine]
    my_off = np.concatenate([[0], np.cumsum(counts)])
    my_conn = np.concatenate([conn[offsets[c] : offsets[c + 1]] for c in mine])
    mine_g = from_cells(part, mine, my_conn, offsets=my_off, celltypes=types[mine],
                        polyhedra=poly.subset(mine), rings=2)  # fmt: skip
    whole_g = from_adjacency(part, adj, rings=2)
    out = {}
    for name, g in (("cells", mine_g), ("whole", whole_g)):
        ei = g.nodes[g.edge_index.numpy()]
        out[name] = {"nodes": g.nodes, "depth": g.ghost_depth, "n_owned_edges": g.n_owned_edges,
                     "all": {tuple(e) for e in ei.T.tolist()}}  # fmt: skip
    out["my_polyhedra"] = int((types[mine] == 42).sum())
    return out


def run_all(rank: int, P: int, cases: list[dict], st_case: dict, pyg_case: dict | None) -> dict:
    """One spawn of ranks for every graph test of world size P."""
    return {
        "oracle": oracle_cases(rank, P, cases),
        "shardtensor": shardtensor_case(rank, P, st_case),
        "bad": bad_input_cases(rank, P),
        "dual": dual_from_cells(rank, P, 600),
        "dual_poly": dual_polyhedra_from_cells(rank, P),
        "pyg": None if pyg_case is None else pyg_cases(rank, P, pyg_case),
    }
