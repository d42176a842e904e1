"""The pointwise rules against one process: operands sharded with different per-rank sizes
(respecced to the first's, also against a Partial) and in-place ops that change a layout; layouts
that cannot be reconciled raise a ``LayoutError`` saying why.

On 2, 3 and 4 gloo ranks, layouts with an empty and a one-row shard and a 2x2 mesh (one spawn per
world size runs every family's cases: :mod:`tests.shardtensor._rule_cases`): every output, and
the gradients of a random projection of them w.r.t. the sharded leaf and the plain weights
(``torch.autograd.grad``), equal one process in fp64."""

import pytest

from tests.shardtensor import _rule_cases as cases


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_pointwise_forward_and_gradients_equal_one_process(world):
    cases.check_cases("pointwise", world)


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_layouts_that_cannot_be_reconciled_fail_with_a_clear_error(world):
    cases.check_probes("pointwise", world)
