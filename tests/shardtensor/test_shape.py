"""The shape rules against one process: cat along the sharded dim, stack/unbind, repeat, flip and
roll; unbind along the sharded dim and cat along a blocked dim fail with a clear error.

Cases: ``_shape_fns.py``, run and compared with one process by
:mod:`tests.shardtensor._rule_cases`."""

from tests.shardtensor import _rule_cases as cases


def test_shape_ops_forward_and_gradients_equal_one_process(rule_world):
    cases.check_cases("shape", rule_world)


def test_unsupported_shape_layouts_fail_with_a_clear_error(rule_world):
    cases.check_probes("shape", rule_world)
