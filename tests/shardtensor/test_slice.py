"""The slice rules against one process: slices with steps and ``select`` of the sharded dim,
``narrow``; a select out of range raises as one process does.

Cases: ``_slice_fns.py``, run and compared with one process by
:mod:`tests.shardtensor._rule_cases`."""

from tests.shardtensor import _rule_cases as cases


def test_slices_forward_and_gradients_equal_one_process(rule_world):
    cases.check_cases("slice", rule_world)


def test_select_out_of_range_fails_with_a_clear_error(rule_world):
    cases.check_probes("slice", rule_world)
