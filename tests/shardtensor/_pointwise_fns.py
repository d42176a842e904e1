"""Cases for ``test_pointwise.py``: pointwise operands sharded with different per-rank sizes
(respecced to the first's), in-place ops that change a layout, and the layouts that cannot be
reconciled, against one process (run by :mod:`tests.shardtensor._rule_cases`)."""

from __future__ import annotations

import torch

from tests.shardtensor._rule_cases import R, case, probe


@case("pointwise", "pointwise_different_sizes", seed=2006, plain_grads=True)
def _c(x):
    n = x.shape[1]
    a, b = x[:, 1 : n - 1], x[:, 2:]  # the same dim, boundaries shifted differently
    c = x[:, : n - 2] * 0.5
    return (a * b, a + b.sin() - c, torch.where(a > 0, b, c), torch.maximum(a, b * 2),
            (a * b).sum(1))


@case("pointwise", "pointwise_different_sizes_partial", seed=2007, plain_grads=True,
      extras=[(R, (1, "N", 5), True)], mesh2d=True)
def _c(x, w):
    n = x.shape[1]
    p = x.sum(0, keepdim=True)  # Partial on the 2-D mesh's batch dim, Shard on the points
    return (p[:, 1:] + w[:, : n - 1], p[:, 1:] * x[:1, : n - 1], p[:, : n - 1] + p[:, 1:])


@case("pointwise", "inplace_layout_change", seed=2008, plain_grads=True,
      extras=[(R, (1, 1, 5), True)])
def _c(x, w):
    n = x.shape[1]
    s = x.sum(1, keepdim=True)  # Partial over the points
    s.div_(3)  # linear: stays Partial
    t = x.sum(1, keepdim=True) * 0.1
    t.exp_()  # not linear: summed first; t itself holds the result
    y = (x.sum(1, keepdim=True) + w).expand(2, n, 5).clone()  # Replicate
    y.mul_(x)  # times a sharded tensor: y keeps only this rank's rows
    z = x.sin()
    z.add_(y).mul_(2)  # no layout change: in place on the local piece
    return s * w, t, y, z


def _rows_cols_twice(ctx):
    from torch.distributed.tensor import Shard

    from meshshard.shardtensor._aten import wrap_local

    layout = ctx.layout
    me, n = ctx.mesh.get_coordinate()[0], sum(layout)
    rows = wrap_local(torch.ones(layout[me], n), ctx.mesh, [Shard(0)], [tuple(layout)])
    cols = wrap_local(torch.ones(n, layout[me]), ctx.mesh, [Shard(1)], [tuple(layout)])
    twice = wrap_local(torch.ones(2 * layout[me], n), ctx.mesh, [Shard(0)],
                       [tuple(2 * v for v in layout)])
    return rows, cols, twice


# layouts that cannot be reconciled (1-D mesh): the error says what differs
@probe("pointwise", "different dims", "LayoutError: aten.mul.Tensor: operands are sharded "
       "differently on mesh dim 0 (output dim 0 as S(0)", on="1d", prefix=True)
def _(ctx):
    rows, cols, _ = _rows_cols_twice(ctx)
    rows * cols


@probe("pointwise", "blocked against shard", "LayoutError: aten.add.Tensor: operands are "
       "sharded differently", on="1d", prefix=True)
def _(ctx):
    rows, _, twice = _rows_cols_twice(ctx)
    rows.repeat(2, 1) + twice  # Blocked(0x2) vs S(0)
