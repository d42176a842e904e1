"""The product rules against one process: einsum, matmul, mv and dot contracting or keeping the
sharded dim.

Cases: ``_linalg_fns.py``, run and compared with one process by
:mod:`tests.shardtensor._rule_cases`."""

from tests.shardtensor import _rule_cases as cases


def test_products_forward_and_gradients_equal_one_process(rule_world):
    cases.check_cases("linalg", rule_world)
