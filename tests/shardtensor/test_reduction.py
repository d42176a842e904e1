"""The reduction rules against one process: all/any, max/min (the lowest global index wins
ties), argmax/argmin, var/std, norms, logsumexp and cumsum over and beside the sharded dim, and a
``create_graph=True`` second-order case through them.

Cases: ``_reduction_fns.py``, run and compared with one process by
:mod:`tests.shardtensor._rule_cases`."""

from tests.shardtensor import _rule_cases as cases


def test_reductions_forward_and_gradients_equal_one_process(rule_world):
    cases.check_cases("reduction", rule_world)
