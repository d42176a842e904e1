"""The indexing rules against one process: index (on and beside the sharded dim),
index_select, gather/scatter/scatter_reduce, index_put/index_add and masked_fill/where; layouts
they cannot do (a sharded index along the sharded dim, a boolean mask) fail with a clear error.

On 2, 3 and 4 gloo ranks, layouts with an empty and a one-row shard and a 2x2 mesh (one spawn per
world size runs every family's cases: :mod:`tests.shardtensor._rule_cases`): every output, and
the gradients of a random projection of them w.r.t. the sharded leaf and the plain weights
(``torch.autograd.grad``), equal one process in fp64."""

import pytest

from tests.shardtensor import _rule_cases as cases


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_indexing_forward_and_gradients_equal_one_process(world):
    cases.check_cases("index", world)


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_unsupported_index_layouts_fail_with_a_clear_error(world):
    cases.check_probes("index", world)
