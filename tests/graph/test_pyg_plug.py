"""Unmodified PyG ``GraphConv`` / ``SAGEConv`` on ShardTensors through
:class:`meshshard.graph.GraphPlug` (issue 22): outputs, the loss, input and every weight
gradient, and a few plain SGD steps equal one process on the whole graph, with no gradient
sync and a plain ``.mean()`` loss. fp64; 2, 3 and 4 gloo ranks; uneven parts with an empty one;
both ghost strategies; sum, mean and max aggregation."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.graph._data import empty_and_isolated, first_empty, slab_uneven

pytest.importorskip("torch_geometric")

from tests.graph import _pyg_fns as fns

# fp64; the distributed sums only reorder additions: measured worst 1.1e-15 relative (all
# cases, outputs, losses, gradients and trained weights); 1e-10 leaves room for other CPUs
_RTOL = 1e-10
_ALL = [("graph", "add"), ("graph", "mean"), ("graph", "max"), ("sage", "mean")]
CASES = {
    2: [{"graph": "dual", "n": 120, "method": "metis", "layers": _ALL},
        {"graph": "knn", "n": 40, "method": "hand", "assign": first_empty,
         "layers": [("graph", "add")]}],
    3: [{"graph": "two", "n": 50, "method": "hand", "assign": empty_and_isolated,
         "layers": [("graph", "add"), ("graph", "max"), ("sage", "mean")]}],
    4: [{"graph": "knn", "n": 60, "method": "hand", "assign": slab_uneven,
         "layers": [("graph", "mean"), ("sage", "mean")]}],
}
BAD_CASE = {"graph": "dual", "n": 120, "method": "metis"}
_RESULTS: dict = {}


def _close(got, want, what):
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    atol = _RTOL * float(want.abs().max()) if want.numel() else 0.0
    torch.testing.assert_close(got, want, rtol=_RTOL, atol=atol, msg=lambda m: f"{what}: {m}")


def _all(rank, P, cases):
    out = {"cases": fns.pyg_cases(rank, P, cases)}
    if P == 2:
        out["bad"] = fns.bad_layout(rank, P, BAD_CASE)
    return out


def _results(P):
    if P not in _RESULTS:
        _RESULTS[P] = run_ranks(_all, P, CASES[P], timeout=600)
    return _RESULTS[P]


@pytest.mark.parametrize("P", sorted(CASES))
def test_pyg_layers_on_shardtensors_equal_one_process(P):
    for rank, per_case in enumerate(r["cases"] for r in _results(P)):
        for ci, res in enumerate(per_case):
            assert len(res) == 2 * len(CASES[P][ci]["layers"])
            for (kind, aggr, strategy), rep in res.items():
                where = f"P={P} case {ci} rank {rank} {kind}/{aggr}/{strategy}"
                assert rep.pop("plain grads"), where
                for key, (got, want) in rep.items():
                    _close(got, want, f"{where} {key}")


def test_pyg_layer_on_the_owned_layout_is_refused_clearly():
    msgs = [r["bad"] for r in _results(2)]
    assert any("outside its own rows" in m for m in msgs), msgs
    assert all(m == "no error" or "GraphPlug.edge_index" in m for m in msgs), msgs
