"""The reduction rules against one process: all/any, max/min (the lowest global index wins
ties), argmax/argmin, var/std, norms, logsumexp and cumsum over and beside the sharded dim, and a
``create_graph=True`` second-order case through them.

On 2, 3 and 4 gloo ranks, layouts with an empty and a one-row shard and a 2x2 mesh (one spawn per
world size runs every family's cases: :mod:`tests.shardtensor._rule_cases`): every output, and
the gradients of a random projection of them w.r.t. the sharded leaf and the plain weights
(``torch.autograd.grad``), equal one process in fp64."""

import pytest

from tests.shardtensor import _rule_cases as cases


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_reductions_forward_and_gradients_equal_one_process(world):
    cases.check_cases("reduction", world)
