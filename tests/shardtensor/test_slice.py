"""The slice rules against one process: slices with steps and ``select`` of the sharded dim,
``narrow``; a select out of range raises as one process does.

On 2, 3 and 4 gloo ranks, layouts with an empty and a one-row shard and a 2x2 mesh (one spawn per
world size runs every family's cases: :mod:`tests.shardtensor._rule_cases`): every output, and
the gradients of a random projection of them w.r.t. the sharded leaf and the plain weights
(``torch.autograd.grad``), equal one process in fp64."""

import pytest

from tests.shardtensor import _rule_cases as cases


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_slices_forward_and_gradients_equal_one_process(world):
    cases.check_cases("slice", world)


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_select_out_of_range_fails_with_a_clear_error(world):
    cases.check_probes("slice", world)
