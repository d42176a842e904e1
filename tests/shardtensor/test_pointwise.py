"""The pointwise rules against one process: operands sharded with different per-rank sizes
(respecced to the first's, also against a Partial) and in-place ops that change a layout; layouts
that cannot be reconciled raise a ``LayoutError`` saying why.

Cases: ``_pointwise_fns.py``, run and compared with one process by
:mod:`tests.shardtensor._rule_cases`."""

from tests.shardtensor import _rule_cases as cases


def test_pointwise_forward_and_gradients_equal_one_process(rule_world):
    cases.check_cases("pointwise", rule_world)


def test_layouts_that_cannot_be_reconciled_fail_with_a_clear_error(rule_world):
    cases.check_probes("pointwise", rule_world)
