"""Unmodified PyG ``GraphConv`` / ``SAGEConv`` on ShardTensors through
:class:`meshshard.graph.GraphPlug`: outputs, the loss, input and every weight
gradient, and a few plain SGD steps equal one process on the whole graph, with no gradient
sync and a plain ``.mean()`` loss. fp64; 2, 3 and 4 gloo ranks; uneven parts with an empty one;
both ghost strategies; sum, mean and max aggregation."""

import pytest
import torch

from tests.graph._data import empty_and_isolated, first_empty, slab_uneven
from tests.shardtensor._oracle import close, ranks_once, together

pytest.importorskip("torch_geometric")

from tests.graph import _pyg_fns as fns

# fp64; the distributed sums only reorder additions: measured worst 1.1e-15 relative over the
# main cases' outputs, losses, gradients and trained weights, 6.5e-16 over the zoo of more
# layers; 1e-10 leaves room for other CPUs
_RTOL = 1e-10
_ALL = [("graph", "add"), ("graph", "mean"), ("graph", "max"), ("sage", "mean")]
CASES = {
    2: [{"graph": "dual", "n": 120, "method": "metis", "layers": _ALL},
        {"graph": "knn", "n": 40, "method": "hand", "assign": first_empty,
         "layers": [("graph", "add")]}],
    3: [{"graph": "two", "n": 50, "method": "hand", "assign": empty_and_isolated,
         "layers": [("graph", "add"), ("graph", "max"), ("sage", "mean")]},
        {"graph": "knn", "n": 45, "method": "hand", "assign": slab_uneven,
         "layers": [("graph", "add"), ("sage", "mean")]}],
    4: [{"graph": "knn", "n": 60, "method": "hand", "assign": slab_uneven,
         "layers": [("graph", "mean"), ("sage", "mean")]}],
}
BAD_CASE = {"graph": "dual", "n": 120, "method": "metis"}
ZOO_CASES = {2: BAD_CASE, 3: {"graph": "knn", "n": 45, "method": "hand", "assign": first_empty}}


def _close(got, want, what, scale=0.0):
    close(got, want, what, _RTOL, scale)


def _results(P):
    jobs = {"cases": (fns.pyg_cases, CASES[P])}
    if P in ZOO_CASES:
        jobs["zoo"] = (fns.zoo_case, ZOO_CASES[P])
    if P == 2:  # these share the spawn of 2 ranks
        jobs.update(refused=(fns.refusals, BAD_CASE), compile=(fns.compile_case, BAD_CASE))
    return ranks_once(together, P, jobs, timeout=600)


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


@pytest.mark.parametrize("P", sorted(ZOO_CASES))
def test_more_pyg_layers_equal_one_process(P):
    for rank, zoo in enumerate(r["zoo"] for r in _results(P)):
        assert len(zoo) == 12
        for name, rep in zoo.items():
            # a gradient that is zero in exact arithmetic is rounding noise (TransformerConv's
            # key bias: softmax ignores a shift, one process gives 1e-18): measure every weight
            # gradient of the layer against the layer's largest one
            scale = max(float(torch.as_tensor(w).abs().max()) for k, (_, w) in rep.items()
                        if k.startswith("grad w"))
            for key, (got, want) in rep.items():
                _close(got, want, f"P={P} rank {rank} {name} {key}",
                       scale if key.startswith("grad w") else 0.0)


def test_uncovered_pyg_paths_are_refused_clearly():
    """The dual graph on 2 ranks: both ranks hold ghosts, so every case is refused on both."""
    for ref in (r["refused"] for r in _results(2)):
        assert "outside its own rows" in ref["owned layout"], ref["owned layout"]
        assert "plug.begin(x)" in ref["owned layout"], ref["owned layout"]
        assert "would count the ghost rows" in ref["batch norm"], ref["batch norm"]
        assert "boolean mask" in ref["self loops"], ref["self loops"]
        assert "plain (global) target" in ref["gcn_norm"], ref["gcn_norm"]


def test_pyg_layers_under_plain_torch_compile_equal_eager():
    """Compiled first (no eager call has recorded the node layout yet), then eager."""
    for rank, rep in enumerate(r["compile"] for r in _results(2)):
        assert rep["graph breaks"] == 0, rep["graph breaks"]
        for k, (a, b) in enumerate(zip(rep["compiled"], rep["eager"], strict=True)):
            _close(a, b, f"rank {rank} tensor {k}")
