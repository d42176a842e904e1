"""The norm rules against one process: softmax / log-softmax and layer norm over the sharded
dim (global two-pass moments, weights narrowed, weight gradients complete), and a
``create_graph=True`` second-order case through layer norm, a respecced product and a view.

Cases: ``_norm_fns.py``, run and compared with one process by
:mod:`tests.shardtensor._rule_cases`."""

from tests.shardtensor import _rule_cases as cases


def test_norm_rules_forward_and_gradients_equal_one_process(rule_world):
    cases.check_cases("norm", rule_world)
