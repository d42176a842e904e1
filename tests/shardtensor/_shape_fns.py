"""Cases for ``test_shape.py``: the shape rules (cat along the sharded dim, stack/unbind, repeat,
flip, roll) and the layouts they refuse, against one process (run by
:mod:`tests.shardtensor._rule_cases`, which describes a case)."""

from __future__ import annotations

import torch

from tests.shardtensor._rule_cases import R, case, probe


@case("shape", "cat_sharded_dim", seed=1020, extras=[(R, (2, 3, 5), True)])
def _c(x, w):
    return torch.cat([x, x * 2], 1), torch.cat([w, x.sin(), w * 2], 1).sum(1), torch.cat([x, x], 2)


@case("shape", "stack_unbind", seed=1021, extras=[(R, (2, "N", 5), True)], mesh2d=False)
def _c(x, y):
    return (torch.stack([x, x.sin()], 0).sum(0), torch.stack([x, y], 3), torch.unbind(x, 0)[1],
            torch.unbind(x, 2)[3] * 2)


@case("shape", "repeat_flip_roll", seed=1022)
def _c(x):
    return (x.repeat(1, 2, 1) * 2, x.repeat(3, 1, 1, 2), x.repeat(1, 3, 1).sum(1), x.flip(2),
            x.flip(1) * 2, x.roll(2, 1), x.roll((1, -1), (2, 1)))


# layouts the rules cannot do: a clear error naming the op
@probe("shape", "unbind along the sharded dim", "aten.unbind.int over the sharded dim 1")
def _(ctx):
    ctx.sample()[1].unbind(1)


@probe("shape", "cat along the shard dim of a blocked", "along the blocked dim")
def _(ctx):
    x = ctx.sample()[1]
    torch.cat([x.repeat(1, 2, 1)] * 2, 1)
