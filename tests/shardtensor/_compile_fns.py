"""Rank functions for ``test_compile.py``: plain ``torch.compile`` functions mixing the rules of
several families, over layouts of different sizes: graph breaks, compilations, and compiled
against eager (loss and gradients), fp64."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.shardtensor._rule_cases import Layout, i64


def counting_compile(fn, backend_name: str = "aot_eager"):
    """(``torch.compile(fn)`` through a backend that counts its compilations, ``stats()`` ->
    {"compiles", "graph breaks", "break reasons"}); dynamo's caches and counters reset."""
    from torch._dynamo import lookup_backend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    calls = {"n": 0}
    inner = lookup_backend(backend_name)

    def backend(gm, example_inputs):
        calls["n"] += 1
        return inner(gm, example_inputs)

    def stats() -> dict:
        return {"compiles": calls["n"], "graph breaks": sum(counters["graph_break"].values()),
                "break reasons": [str(k) for k in counters["graph_break"]]}

    return torch.compile(fn, backend=backend), stats


def _eager_and_compiled(rank, world, layouts, f, weights_of):
    """Per layout, ``f(x, *weights)`` eager and compiled: [loss, d loss/dx, d loss/dw]."""
    cf, stats = counting_compile(f)
    pairs = []
    for layout in layouts:
        ctx = Layout(rank, world, layout)
        g = torch.Generator().manual_seed(3)
        X = torch.randn(2, ctx.n, 5, generator=g, dtype=torch.float64)
        extras, w = weights_of(ctx, g)
        out = {}
        for tag, fn in (("eager", f), ("compiled", cf)):
            x = ctx.shard(X).detach().requires_grad_()
            loss = fn(x, *extras, w)
            gx, gw = torch.autograd.grad(loss, [x, w])
            out[tag] = [loss.full_tensor().detach(), gx.full_tensor(), gw]
        pairs.append(out)
    return {"pairs": pairs, **stats()}


def _mix(x, gidx, w):
    v, i = x.max(1)
    y = torch.cat([x, x.gather(2, gidx) @ w[:2]], 2)
    z = torch.logsumexp(y, 1) + y.var(1) + torch.linalg.vector_norm(y, dim=1)
    t = torch.where(x > 0, x.cumsum(2), x.amax(2, keepdim=True))
    u = torch.cat([t, t * 2], 1).sum(1)
    return (z.sum() + (v * i).sum() + u.sum() + x.index_select(2, i64(4, 0)).pow(2).sum()
            + (x[:, 1:] ** 2).sum())


def _mix_weights(ctx, g):
    gidx = torch.randint(0, 5, (2, ctx.n, 2), generator=g)
    w = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    return [ctx.shard(gidx)], w


def reductions_indexing_shape_case(rank, world, layouts):
    """One function mixing reductions, indexing, cat, slices and a product."""
    return _eager_and_compiled(rank, world, layouts, _mix, _mix_weights)


def _norm_respec_view(x, w):
    n = x.shape[1]
    y = F.layer_norm(x, (n, 5), w[:n])
    z = x[:, 1:] * y[:, : n - 1]
    v = x.unsqueeze(2).expand(2, n, 3, 5).reshape(2, 3 * n, 5).reshape(2, n, 3, 5)
    # the amax term makes the loss Replicate: a Partial output of a compiled region meets
    # a Replicate tangent, which the class cannot coerce yet (no
    # __coerce_same_metadata_as_tangent__)
    return (y * y.cos()).sum() + z.sum() + (v.sum(2) * y).sum() + x.amax()


def _norm_weights(ctx, g):
    return [], torch.randn(16, 5, generator=g, dtype=torch.float64, requires_grad=True)


def layer_norm_respec_view_case(rank, world, layouts):
    """One function using layer norm over the sharded dim, a respecced product and a
    whole-row split view."""
    return _eager_and_compiled(rank, world, layouts, _norm_respec_view, _norm_weights)
