"""The world sizes the rule families' tests run on (one spawn each, shared by every family)."""

import pytest

from tests.shardtensor._rule_cases import LAYOUTS


@pytest.fixture(params=sorted(LAYOUTS))
def rule_world(request) -> int:
    """A world size of :data:`tests.shardtensor._rule_cases.LAYOUTS`."""
    return request.param
