"""What an op without a rule gets: an op with no exact local path is refused with an error
naming it, on every layout (uneven, empty shards, a 2x2 mesh).

Probes: ``_fallback_fns.py``, run by :mod:`tests.shardtensor._rule_cases`."""

from tests.shardtensor import _rule_cases as cases


def test_an_op_without_a_rule_fails_with_a_clear_error(rule_world):
    cases.check_probes("fallback", rule_world)
