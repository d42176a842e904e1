"""The indexing rules against one process: index (on and beside the sharded dim),
index_select, gather/scatter/scatter_reduce, index_put/index_add and masked_fill/where; layouts
they cannot do (a sharded index along the sharded dim, a boolean mask) fail with a clear error.

Cases: ``_index_fns.py``, run and compared with one process by
:mod:`tests.shardtensor._rule_cases`."""

from tests.shardtensor import _rule_cases as cases


def test_indexing_forward_and_gradients_equal_one_process(rule_world):
    cases.check_cases("index", rule_world)


def test_unsupported_index_layouts_fail_with_a_clear_error(rule_world):
    cases.check_probes("index", rule_world)
