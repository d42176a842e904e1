"""Probes for ``test_fallback.py``: an op with no rule and no exact local path is refused
with an error naming it (run by :mod:`tests.shardtensor._rule_cases`)."""

from __future__ import annotations

import torch

from tests.shardtensor._rule_cases import probe


@probe("fallback", "unknown op", "no sharding rule for aten.sort")
def _(ctx):
    torch.sort(ctx.sample()[1], dim=1)
