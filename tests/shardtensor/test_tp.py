"""Tensor-parallel products on ShardTensors (``rules/tp.py``): column- and
row-parallel ``F.linear`` with ShardTensor weight pieces, ``einsum`` / ``matmul`` / linear on
tensors sharded on several dims at once (batch on "data", points on "domain", heads or features
on "tensor"), and the local head-splitting view, on 2 and 4 gloo ranks (meshes 1x2x1, 1x1x2,
1x2x2, 2x1x2; points uneven with an empty shard) against one process in fp64: outputs, the
gradient of every leaf (sharded and plain), one second-order term, the output layouts, and the
forward all-reduces (none for column-parallel, one over "tensor" for row-parallel)."""

import pytest

from tests.shardtensor import _rule_cases as cases
from tests.shardtensor import _tp_fns as F
from tests.shardtensor._oracle import close, ranks_once

# measured: the largest relative difference from one process over every case and layout here
# is 4.0e-16 (fp64 rounding); 1e-10 leaves room for other summation orders
_RTOL64 = 1e-10
SHAPES = {2: [(1, 2, 1), (1, 1, 2)], 4: [(1, 2, 2), (2, 1, 2)]}
LAYOUTS = {1: [(7,)], 2: [(3, 5), (0, 8)]}

# forward all-reduces per case, given the mesh sizes (data, domain, tensor)
_COUNTS = {
    "rowwise": lambda m: {"tensor": 1} if m[2] > 1 else {},
    "linear_plain_weight_partial_input": lambda m: {"domain": 1} if m[1] > 1 else {},
}


def _reports(world):
    return ranks_once(F.all_cases, world, SHAPES[world], LAYOUTS, timeout=300,
                      collective_timeout=60)


@pytest.mark.parametrize("world", sorted(SHAPES))
def test_tp_products_equal_one_process(world):
    for rank, per_layout in enumerate(_reports(world)):
        assert len(per_layout) == sum(len(LAYOUTS[s[1]]) for s in SHAPES[world])
        for (shape, n), rep in per_layout.items():
            where = f"rank {rank} mesh {shape} points {n}"
            assert len(rep["pairs"]) > 20, where
            for key, (got, want) in rep["pairs"].items():
                close(got, want, f"{where} {key}", _RTOL64)
            for name, (got, want) in rep["placements"].items():
                assert got == want, (where, name)
            for name, seen in rep["counts"].items():
                assert seen == _COUNTS.get(name, lambda m: {})(shape), (where, name, seen)


def test_einsum_over_heads_of_a_data_x_domain_tensor_equals_one_process(rule_world):
    # batch sharded on one mesh dim and points on the other (the 2x2 layout), and uneven
    # points on a 1-D mesh: a case of the rule families' shared spawn (_rule_cases)
    cases.check_cases("tp", rule_world)
