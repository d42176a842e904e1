"""What an op without a rule gets: an op with no exact local path is refused with an error
naming it, on every layout (uneven, empty shards, a 2x2 mesh).

One spawn per world size runs every family's cases and probes
(:mod:`tests.shardtensor._rule_cases`)."""

import pytest

from tests.shardtensor import _rule_cases as cases


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_an_op_without_a_rule_fails_with_a_clear_error(world):
    cases.check_probes("fallback", world)
