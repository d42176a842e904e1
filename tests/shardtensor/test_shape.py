"""The shape rules against one process: cat along the sharded dim, stack/unbind, repeat, flip and
roll; unbind along the sharded dim and cat along a blocked dim fail with a clear error.

On 2, 3 and 4 gloo ranks, layouts with an empty and a one-row shard and a 2x2 mesh (one spawn per
world size runs every family's cases: :mod:`tests.shardtensor._rule_cases`): every output, and
the gradients of a random projection of them w.r.t. the sharded leaf and the plain weights
(``torch.autograd.grad``), equal one process in fp64."""

import pytest

from tests.shardtensor import _rule_cases as cases


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_shape_ops_forward_and_gradients_equal_one_process(world):
    cases.check_cases("shape", world)


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_unsupported_shape_layouts_fail_with_a_clear_error(world):
    cases.check_probes("shape", world)
