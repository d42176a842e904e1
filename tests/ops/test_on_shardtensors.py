"""The neighbour ops (``meshshard.ops``) on ShardTensors: outputs are
of the input's class, values equal scipy's cKDTree on the gathered points, and distances and
gathered rows are differentiable w.r.t. the sharded inputs (oracle: one process, fp64)."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.ops import _on_shardtensors_fns as fns

LAYOUTS = {2: [(3, 5), (0, 8)], 3: [(1, 1, 6)]}


def _run(rank, world, layouts):
    return {s: fns.cases(rank, world, s, 2) for s in layouts}


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_knn_and_gather_on_the_aten_class_equal_one_process(world):
    for rank, per in enumerate(run_ranks(_run, world, LAYOUTS[world], timeout=240)):
        for sizes, rep in per.items():
            assert rep.pop("classes") is True
            for key, (got, want) in rep.items():
                if key == "index":
                    assert torch.equal(got, want), (rank, sizes)
                    continue
                torch.testing.assert_close(got.double(), want.double(), rtol=1e-10, atol=1e-12,
                                           msg=lambda m, k=key, s=sizes: f"{s} {k}: {m}")


def test_neighbour_queries_compile_with_one_graph_break_each():
    """Under ``torch.compile`` a kNN and a radius query are one graph break each (they run
    eagerly, ``torch.compiler.disable``; Dynamo traced into the search before: 34 breaks for a
    kNN alone), and the value and the points' gradient equal eager's, also with an empty
    shard."""
    for world, layouts in ((2, [(3, 5), (0, 8)]), (3, [(1, 1, 6)])):
        for rank, per in enumerate(run_ranks(fns.compiled_cases, world, layouts, timeout=300)):
            for sizes, rep in zip(layouts, per):
                assert rep["breaks"] == 2, (rank, sizes)
                for key in ("value", "grad"):
                    torch.testing.assert_close(*rep[key], rtol=1e-12, atol=1e-12,
                                               msg=lambda m, k=key, s=sizes: f"{s} {k}: {m}")
