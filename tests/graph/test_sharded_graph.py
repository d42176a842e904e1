"""ShardedGraph, refresh_ghosts, aggregate and a MeshGraphNet on real gloo ranks against one
process on the whole graph (forward values and every parameter gradient)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard.testing.distributed import run_ranks
from tests.graph._data import empty_and_isolated, first_empty, problem, slab_uneven
from tests.graph._fns import model_run

CASES = {
    2: [
        {"graph": "dual", "n": 300, "method": "metis"},
        {"graph": "dual", "n": 300, "method": "hilbert", "build": "full", "layers": 3},
        {"graph": "two", "n": 60, "method": "hand", "assign": empty_and_isolated},
        {"graph": "knn", "n": 70, "method": "hand", "assign": slab_uneven, "reduces": ("max",)},
        {"graph": "knn", "n": 40, "method": "hand", "assign": first_empty, "layers": 3},
        {"graph": "directed", "n": 50, "method": "hilbert", "symmetric": False,
         "reduces": ("sum",)},  # fmt: skip
    ],
    4: [
        {"graph": "dual", "n": 300, "method": "metis"},
        {"graph": "knn", "n": 90, "method": "hilbert", "layers": 3, "reduces": ("mean",)},
        {"graph": "two", "n": 70, "method": "hand", "assign": empty_and_isolated},
        {"graph": "knn", "n": 50, "method": "hand", "assign": first_empty, "reduces": ("mean",)},
        {"graph": "knn", "n": 60, "method": "hand", "assign": slab_uneven, "build": "full",
         "reduces": ("sum", "max")},  # fmt: skip
    ],
}
ST_CASE = {"graph": "knn", "n": 50, "method": "hand", "assign": slab_uneven}
PYG_CASE = {"graph": "dual", "n": 200, "method": "metis"}
try:
    import torch_geometric  # noqa: F401

    HAVE_PYG = True
except ImportError:  # optional extra: meshshard[graph]
    HAVE_PYG = False
IDS = [(P, i) for P, cs in CASES.items() for i in range(len(cs))]
_RESULTS: dict[int, list] = {}


def _results(P: int) -> list:
    if P not in _RESULTS:
        from tests.graph._fns import run_all

        pyg = PYG_CASE if HAVE_PYG else None
        _RESULTS[P] = run_ranks(run_all, P, CASES[P], ST_CASE, pyg, timeout=300)
    return _RESULTS[P]


def _oracle(P: int, ci: int) -> list:
    return [r["oracle"][ci] for r in _results(P)]


@pytest.mark.parametrize(("P", "ci"), IDS)
def test_layout_and_edge_ownership(P: int, ci: int) -> None:
    case = CASES[P][ci]
    prob = problem(case, P)
    part, ei = prob["partition"], prob["edge_index"]
    per = _oracle(P, ci)
    for rank, r in enumerate(per):
        owned = r["nodes"][: r["n_owned"]]
        np.testing.assert_array_equal(owned, part.shard_rows(rank))  # partition order
        ghosts = r["nodes"][r["n_owned"] :]
        assert (part.assignment[ghosts] != rank).all()
        stored = part.inverse[ghosts]
        assert (np.diff(stored) > 0).all()  # by stored row = by owner, then row
        # ghosts are exactly the non-owned sources of the in-edges of owned nodes
        ins = part.assignment[ei[1]] == rank
        want = np.unique(ei[0, ins][part.assignment[ei[0, ins]] != rank])
        np.testing.assert_array_equal(np.sort(ghosts), want)
        assert r["attr_ok"]
    # the rule: the edge i -> j is owned by the owner of j; each edge exactly once
    for key, n_key in (("edge_ids", "n_owned_edges"), ("edge_ids_k", "n_owned_edges_k")):
        owned_ids = np.concatenate([r[key][: r[n_key]] for r in per])
        np.testing.assert_array_equal(np.sort(owned_ids), np.arange(ei.shape[1]))
        for rank, r in enumerate(per):
            assert (part.assignment[ei[1, r[key][: r[n_key]]]] == rank).all()


@pytest.mark.parametrize(("P", "ci"), IDS)
def test_k_ring_ghosts(P: int, ci: int) -> None:
    """rings = L holds every node within L hops upstream, with its depth."""
    case = CASES[P][ci]
    prob = problem(case, P)
    part, ei = prob["partition"], prob["edge_index"]
    n = part.num_points
    layers = case.get("layers", 2)
    import scipy.sparse as sp

    a = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(n, n))  # a[s, t]: s -> t
    for rank, r in enumerate(_oracle(P, ci)):
        reach = np.zeros(n, dtype=np.int64) - 1
        front = part.assignment == rank
        reach[front] = 0
        for d in range(1, layers + 1):
            front = (a @ front.astype(np.int64)) > 0
            front &= reach < 0
            reach[front] = d
        ghosts = r["nodes_k"][r["n_owned"] :]
        want = np.flatnonzero(reach > 0)
        np.testing.assert_array_equal(np.sort(ghosts), want)
        np.testing.assert_array_equal(r["depth_k"], reach[ghosts])


@pytest.mark.parametrize(("P", "ci"), IDS)
def test_refresh_and_aggregate(P: int, ci: int) -> None:
    case = CASES[P][ci]
    prob = problem(case, P)
    per = _oracle(P, ci)
    n = prob["x"].shape[0]
    grad = np.zeros((n, prob["x"].shape[1]), dtype=np.float32)
    for rank, r in enumerate(per):
        np.testing.assert_array_equal(r["refreshed"], prob["x"][r["nodes"]])
        np.add.at(grad, r["nodes"], prob["w"][r["nodes"], :1] * (1 + rank))  # every column
    got = np.zeros_like(grad)
    for r in per:
        got[r["nodes"][: r["n_owned"]]] = r["refresh_grad"]
    np.testing.assert_allclose(got, grad, rtol=1e-6)
    from meshshard.models.meshgraphnet import FullGraph

    full = FullGraph(torch.from_numpy(prob["edge_index"]), n)
    for reduce in ("sum", "mean", "max"):
        want = full.aggregate(torch.from_numpy(prob["messages"]), reduce).numpy()
        for r in per:
            np.testing.assert_allclose(r["agg"][reduce], want[r["nodes"][: r["n_owned"]]],
                                       rtol=1e-5, atol=1e-6)  # fmt: skip
    for r in per:  # GhostExchange's per-layer refresh: the plan's rows cached on the device
        assert r["layer_syncs"] == 0, r["layer_syncs"]
        b = r["begin_syncs"]  # (first begin, second begin) host syncs per validate mode
        assert b["always"][0] >= 1 and b["always"][1] == b["always"][0], b
        assert b["once"] == (b["always"][0], 0), b
        assert b["never"] == (0, 0), b


def test_ghost_exchange_rejects_a_bad_validate_mode() -> None:
    from meshshard.graph import GhostExchange

    with pytest.raises(ValueError, match="validate='sometimes' must be"):
        GhostExchange(None, validate="sometimes")


MODEL_IDS = [
    (P, i, red, strat)
    for P, cs in CASES.items()
    for i, c in enumerate(cs)
    for red in c.get("reduces", ("sum", "mean", "max"))
    for strat in ("per_layer", "once")
]


@pytest.mark.parametrize(("P", "ci", "reduce", "strategy"), MODEL_IDS)
def test_meshgraphnet_matches_one_process(P: int, ci: int, reduce: str, strategy: str) -> None:
    from meshshard.models.meshgraphnet import FullGraph

    case = CASES[P][ci]
    prob = problem(case, P)
    layers = case.get("layers", 2)
    n = prob["x"].shape[0]
    full = FullGraph(torch.from_numpy(prob["edge_index"]), n)
    model, out, _ = model_run(prob, full, torch.from_numpy(prob["x"]),
                              torch.from_numpy(prob["edge_attr"]), reduce, layers,
                              np.arange(n))  # fmt: skip
    per = _oracle(P, ci)
    for r in per:
        got = r["model"][reduce, strategy]
        want = out.detach().numpy()[r["nodes"][: r["n_owned"]]]
        np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-6)
        assert got["refreshes"] == (layers if strategy == "per_layer" else 1)
        for name, p in model.named_parameters():
            np.testing.assert_allclose(got["grads"][name], p.grad.numpy(), rtol=1e-5,
                                       atol=1e-5 * float(np.abs(p.grad.numpy()).max()) + 1e-7,
                                       err_msg=name)  # fmt: skip


@pytest.mark.parametrize("P", [2, 4])
def test_ghost_rows_once_vs_per_layer(P: int) -> None:
    """The k-ring strategy moves more ghost rows in its one exchange than one ring does."""
    for ci in range(len(CASES[P])):
        for r in _oracle(P, ci):
            assert r["moved_k"] >= r["moved"]


@pytest.mark.parametrize("P", [2, 4])
def test_shardtensor_input(P: int) -> None:
    prob = problem(ST_CASE, P)
    for r in [res["shardtensor"] for res in _results(P)]:
        np.testing.assert_array_equal(r["refreshed"], prob["x"][r["nodes"]])
        assert r["error"] is not None and "sharding sizes" in r["error"] or "rows" in r["error"]


@pytest.mark.parametrize("P", [2, 4])
def test_bad_input_raises_on_every_rank(P: int) -> None:
    per = [res["bad"] for res in _results(P)]
    expect = {
        "outside": "outside the graph",
        "negative": "outside the graph",
        "count_mismatch": "partition has 40 nodes",
        "parts_mismatch": f"{P + 1} parts but there are {P} ranks",
        "not_symmetric": "not symmetric",
        "twice": "edge id twice",
        "rows": "owned + ",
    }
    for name, text in expect.items():
        msgs = [r[name] for r in per]
        assert all(m is not None for m in msgs), (name, msgs)
        assert any(text in m for m in msgs), (name, msgs)
    assert all(r["after_ok"] for r in per)


def test_build_all_matches_ranks() -> None:
    """The in-process builder (used by preprocessing) gives the ranks' pieces exactly."""
    from meshshard.graph import build_all

    case = CASES[2][0]
    prob = problem(case, 2)
    pieces = build_all(prob["partition"], prob["edge_index"], edge_attr=prob["edge_attr"])
    for g, r in zip(pieces, _oracle(2, 0)):
        np.testing.assert_array_equal(g.nodes, r["nodes"])
        np.testing.assert_array_equal(np.sort(g.edge_ids), np.sort(r["edge_ids"]))


@pytest.mark.skipif(not HAVE_PYG, reason="torch_geometric not installed (extra: graph)")
@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("kind", ["gcn", "gcn_norm", "graphconv", "edgeconv"])
def test_unmodified_pyg_layers(P: int, kind: str) -> None:
    """GCNConv (2 rings: its ghosts' degrees must be complete; or 1 ring with normalize=False
    and meshshard.graph.gcn_norm's weights), GraphConv and EdgeConv (1 ring) on each rank's
    local subgraph with a refresh per layer equal one process (default GCN normalisation)."""
    from tests.graph._fns import pyg_forward, pyg_layers

    prob = problem(PYG_CASE, P)
    layers = pyg_layers("gcn" if kind == "gcn_norm" else kind)
    ei = torch.from_numpy(prob["edge_index"])
    out = pyg_forward(layers, torch.from_numpy(prob["x"]), ei, lambda h: h, lambda h: h)
    (out * torch.from_numpy(prob["w"])).sum().backward()
    params = [p for m in layers for p in m.parameters()]
    for res in _results(P):
        got = res["pyg"][kind]
        np.testing.assert_allclose(got["out"], out.detach().numpy()[got["nodes"]], rtol=1e-5,
                                   atol=1e-6)  # fmt: skip
        for g, p in zip(got["grads"], params):
            scale = float(np.abs(p.grad.numpy()).max())
            np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-5, atol=1e-5 * scale + 1e-7)


@pytest.mark.parametrize("P", [2, 4])
def test_dual_graph_from_each_ranks_cells(P: int) -> None:
    """from_cells (faces matched across ranks by hash) gives the whole mesh's dual graph."""
    for res in _results(P):
        a, b = res["dual"]["cells"], res["dual"]["whole"]
        np.testing.assert_array_equal(a["nodes"], b["nodes"])
        np.testing.assert_array_equal(a["depth"], b["depth"])
        assert a["n_owned_edges"] == b["n_owned_edges"] > 0
        assert a["owned"] == b["owned"] and a["all"] == b["all"]


@pytest.mark.parametrize("P", [2, 4])
def test_dual_graph_of_polyhedra_from_each_ranks_cells(P: int) -> None:
    """The same with OpenFOAM's polyhedra: faces of up to 6 points matched across ranks."""
    res = _results(P)
    assert sum(r["dual_poly"]["my_polyhedra"] for r in res) == 18
    for r in res:
        a, b = r["dual_poly"]["cells"], r["dual_poly"]["whole"]
        np.testing.assert_array_equal(a["nodes"], b["nodes"])
        np.testing.assert_array_equal(a["depth"], b["depth"])
        assert a["n_owned_edges"] == b["n_owned_edges"] > 0
        assert a["all"] == b["all"]


def test_edge_attr_dtype_is_kept_or_refused() -> None:
    """Issue 26: float64 edge features were cast to float32 silently. They keep their dtype
    (and values, bit for bit); a non-numeric dtype, or ranks that disagree, are refused."""
    import meshshard.graph.build as gb
    from meshshard.comm.transport import run_threads
    from meshshard.graph import build_all

    prob = problem(CASES[2][0], 2)
    part, ei = prob["partition"], prob["edge_index"]
    attr = np.random.default_rng(0).normal(size=(ei.shape[1], 2)) * 1e-9 + 1.0  # float64
    for dtype in (np.float64, np.int32, np.float32):
        a = attr.astype(dtype)
        for g in build_all(part, ei, edge_attr=a):
            assert g.edge_attr.numpy().dtype == dtype
            np.testing.assert_array_equal(g.edge_attr.numpy(), g.local_edges(a))
    with pytest.raises(ValueError, match="edge_attr of dtype <U1: expected numbers"):
        build_all(part, ei, edge_attr=np.full((ei.shape[1], 1), "x"))

    partition, inverse = gb._prepare(part)
    src, dst = gb._edge_rows(ei)

    def mixed(comm):
        a = attr.astype(np.float64 if comm.rank == 0 else np.float32)
        s, d, eid, at, routed = gb._owned_slice(partition, comm.rank, src, dst, a)
        return gb._build(comm, partition, inverse, s, d, eid, at, rings=1, symmetric=False,
                         routed=routed)  # fmt: skip

    with pytest.raises(ValueError, match="ranks gave edge_attr of different dtypes"):
        run_threads(mixed, 2)
