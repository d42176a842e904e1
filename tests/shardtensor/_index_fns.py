"""Cases for ``test_index.py``: the indexing rules (index, index_select, gather/scatter,
index_put/index_add, masked_fill/where) and the layouts they refuse, against one process (run by
:mod:`tests.shardtensor._rule_cases`, which describes a case)."""

from __future__ import annotations

import torch

from tests.shardtensor._rule_cases import R, case, i64, probe


@case("index", "index", seed=1011, extras=[("idx", 5, (2, 0, 4, 4))], mesh2d=True)
def _c(x, idx):
    return x[:, :, idx] * 2, x[:, :, i64(1, 0)][..., None] * x[..., :1, None]


@case("index", "index_dim0", seed=1012, extras=[("idx", 2, (1, 0, 1))], mesh2d=False)
def _c(x, idx):
    return x[idx] * 2, x[idx, :, i64(3, 1, 0)]


@case("index", "index_select", seed=1013, extras=[("idx", 5, (4, 0, 0, 2))])
def _c(x, idx):
    return x.index_select(2, idx), x.index_select(2, idx[:1]) * x


@case("index", "gather_scatter", seed=1014, extras=[("gidx", 5, 3)])
def _c(x, gidx):
    g = x.gather(2, gidx)
    sa = torch.zeros(x.shape[0], x.shape[1], 5, dtype=x.dtype).scatter_add(2, gidx, g * 2)
    s = x.scatter(2, gidx[..., :1], x[..., :1] * 3)
    sv = x.scatter(2, gidx[..., 1:2], 0.5)
    return g, sa, s, sv


@case("index", "scatter_reduce", seed=1015, extras=[("gidx", 5, 3)])
def _c(x, gidx):
    src = x[..., :3] * 2
    return (x.scatter_reduce(2, gidx, src, "sum"), x.scatter_reduce(2, gidx, src, "amax"),
            x.scatter_reduce(2, gidx, src, "mean", include_self=False))


@case("index", "gather_index_select_sharded_dim", seed=1016,
      extras=[("nidx", (2, 4, 5)), ("nidx", (6,))])
def _c(x, gi, ii):
    return x.gather(1, gi) * 2, x.index_select(1, ii), x.index_select(1, ii[:1]).sum(1)


@case("index", "index_put_add", seed=1017, extras=[("idx", 2, (1, 0, 1)), ("idx", 5, (3, 3, 0))],
      mesh2d=False)
def _c(x, i0, i2):
    a = x.index_put((i0,), x[0:1] * 3, accumulate=True)
    b = x.transpose(0, 2).index_put((i2,), x.transpose(0, 2)[:3] * 2).transpose(0, 2)
    c = x.index_add(2, i2, x[..., :3] * 0.5)
    return a, b, c


@case("index", "masked_where", seed=1018, extras=[(R, (2, "N", 5), True), (R, (), True)])
def _c(x, y, v):
    return (x.masked_fill(x > 0.3, 1.5), x.masked_fill(x < 0, v), torch.where(x > 0, x, y * 2),
            torch.where(y > 0, x * x, 0.0))


# layouts the rules cannot do: a clear error naming the op
@probe("index", "gather with a sharded index along the sharded dim",
       "a sharded index along the sharded")
def _(ctx):
    ctx.sample()[1].gather(1, ctx.shard(torch.zeros(2, ctx.n, 5, dtype=torch.int64)))


@probe("index", "index tensor on the sharded dim", "an index tensor on the sharded dim 1")
def _(ctx):
    ctx.sample()[1][:, i64(0, 1)]


@probe("index", "boolean mask", "a boolean mask index")
def _(ctx):
    X, x = ctx.sample()
    x[X > 0]
