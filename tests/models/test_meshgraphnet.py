"""The plain-torch MeshGraphNet and its single-process graph plug."""

from __future__ import annotations

import doctest

import pytest
import torch

from meshshard.models import FullGraph, MeshGraphNet
from meshshard.models import meshgraphnet as mgn


def test_docstring_examples_run():
    result = doctest.testmod(mgn)
    assert result.attempted > 0 and result.failed == 0


def test_full_graph_aggregations_against_loops():
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 7, (2, 30), generator=g)
    ei[1, ei[1] == 6] = 5  # node 6 receives nothing
    m = torch.randn(30, 3, generator=g)
    plug = FullGraph(ei, 7)
    for reduce in ("sum", "mean", "max"):
        got = plug.aggregate(m, reduce)
        for v in range(7):
            rows = m[ei[1] == v]
            if rows.numel() == 0:
                want = torch.zeros(3)
            else:
                want = {"sum": rows.sum(0), "mean": rows.mean(0), "max": rows.max(0).values}[reduce]
            torch.testing.assert_close(got[v], want)
    with pytest.raises(ValueError, match="reduce"):
        plug.aggregate(m, "min")


def test_model_has_no_meshshard_imports_and_checks_aggr():
    import inspect

    src = inspect.getsource(mgn)
    assert "import meshshard" not in src and "from meshshard" not in src
    with pytest.raises(ValueError, match="aggr"):
        MeshGraphNet(3, 2, 1, aggr="min")


def test_node_permutation_equivariance():
    """Relabelling the nodes permutes the output: the model sees only the graph."""
    g = torch.Generator().manual_seed(1)
    n = 12
    ei = torch.randint(0, n, (2, 40), generator=g)
    x, ea = torch.randn(n, 3, generator=g), torch.randn(40, 2, generator=g)
    torch.manual_seed(0)
    model = MeshGraphNet(3, 2, 2, hidden=8, layers=3, aggr="mean")
    out = model(x, ea, FullGraph(ei, n))
    perm = torch.randperm(n, generator=g)
    inv = torch.argsort(perm)
    out_p = model(x[perm], ea, FullGraph(inv[ei], n))
    torch.testing.assert_close(out_p, out[perm], rtol=1e-5, atol=1e-6)
