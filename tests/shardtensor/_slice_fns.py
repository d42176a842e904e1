"""Cases for ``test_slice.py``: slices and ``select`` of the sharded dim, against one process
(run by :mod:`tests.shardtensor._rule_cases`, which describes a case)."""

from __future__ import annotations

from tests.shardtensor._rule_cases import case, probe


@case("slice", "slice_select", seed=1019)
def _c(x):
    n = x.shape[1]
    return (x[:, 1 : n - 1] * 2, x[:, ::2], x[:, 2:].sum(1), x[:, n // 2], x[:, -1] * x[:, 0],
            x[1] * 3, x.narrow(1, 1, n - 2).amax(1))


@probe("slice", "select out of range", "out of")
def _(ctx):
    ctx.sample()[1][:, ctx.n + 3]
