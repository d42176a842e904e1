"""Rank functions for ``test_aten_norm.py``: layer norm over the sharded dim, pointwise ops
between operands sharded with different per-rank sizes, and views splitting a sharded dim by
whole rows on one or two mesh dims, on the aten-level ShardTensor, against one process (fp64).

A case is ``fn(x, *extras)`` as in ``_aten_ops_fns`` (``x`` is (2, N, 5), sharded on dim 1, on a
2-D mesh also on dim 0); extras made with ``grad=True`` are plain weights needing a gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.shardtensor._aten_ops_fns import R, _extra, _mesh_and_shard, _outs

CASES: dict = {}


def case(name, extras=(), mesh2d=True, grad=True):
    def deco(fn):
        CASES[name] = (fn, extras, mesh2d, grad)
        return fn

    return deco


# ------------------------------------------------------------------ layer norm
@case("layer_norm_over_sharded", extras=[(R, ("N", 5), True), (R, ("N", 5), True)])
def _c(x, w, b):
    n = x.shape[1]
    return (F.layer_norm(x, (n, 5), w, b), F.layer_norm(x * 3, (n, 5)),
            F.layer_norm(x, (n, 5), w) * x, F.layer_norm(x.sin(), (n, 5), None, b))


@case("layer_norm_all_dims", extras=[(R, (2, "N", 5), True)])
def _c(x, w):
    return F.layer_norm(x, tuple(x.shape), w, w * 0.5), F.layer_norm(x.cos(), tuple(x.shape))


@case("layer_norm_large_mean", extras=[(R, ("N", 5), True)])
def _c(x, w):
    # a mean 1e4 times the spread: a one-pass E[x^2] - E[x]^2 would lose ~8 digits (an error
    # ~1e-8, past the tolerance); the input's own rounding (1e4 * 1.1e-16) bounds the rest
    return (F.layer_norm(x + 1e4, (x.shape[1], 5), w),)


@case("layer_norm_partial_input", extras=[(R, (1, "N", 5), True)])
def _c(x, w):
    # on the 2-D mesh the sum over the batch is Partial on one mesh dim, sharded on the other
    t = x.sum(0, keepdim=True)
    return F.layer_norm(t, (x.shape[1], 5), w[0]), F.layer_norm(t * w, tuple(t.shape))


@case("layer_norm_blocked", extras=[(R, ("2N", 5), True)], mesh2d=False)
def _c(x, w):
    y = x.repeat(1, 2, 1)  # the sharded dim repeated: Blocked, each rank's rows in each block
    return F.layer_norm(y, tuple(y.shape[1:]), w, w.cos()), (F.layer_norm(y, (5,)) * y).sum(1)


@case("layer_norm_module_and_other_dims", extras=[(R, (5,), True)])
def _c(x, w):
    ln = torch.nn.LayerNorm((x.shape[1], 5), dtype=torch.float64)
    with torch.no_grad():
        ln.weight.mul_(2)
    return ln(x), F.layer_norm(x, (5,), w, w)  # the second stays local


# ------------------------------------------------------------------ pointwise respec
@case("pointwise_different_sizes")
def _c(x):
    n = x.shape[1]
    a, b = x[:, 1 : n - 1], x[:, 2:]  # the same dim, boundaries shifted differently
    c = x[:, : n - 2] * 0.5
    return (a * b, a + b.sin() - c, torch.where(a > 0, b, c), torch.maximum(a, b * 2),
            (a * b).sum(1))


@case("pointwise_different_sizes_partial", extras=[(R, (1, "N", 5), True)], mesh2d=True)
def _c(x, w):
    n = x.shape[1]
    p = x.sum(0, keepdim=True)  # Partial on the 2-D mesh's batch dim, Shard on the points
    return (p[:, 1:] + w[:, : n - 1], p[:, 1:] * x[:1, : n - 1], p[:, : n - 1] + p[:, 1:])


# ------------------------------------------------------------------ in place
@case("inplace_layout_change", extras=[(R, (1, 1, 5), True)])
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


# ------------------------------------------------------------------ views splitting a shard
@case("view_split_whole_rows", extras=[(R, (1, 3, 1, 1), True)])
def _c(x, w):
    n = x.shape[1]
    h = x.unsqueeze(1).expand(2, 3, n, 5) * w  # (B, H, N, D)
    m = h.reshape(6, n, 5)  # B*H: sharded where the batch is (sizes * 3)
    back = (m * 2).reshape(2, 3, n, 5)  # split by whole rows, on every mesh dim at once
    t = x.unsqueeze(2).expand(2, n, 4, 5).reshape(2, n * 4, 5)  # N*4: sizes * 4
    return back.sum(1), m.reshape(2, 3, n * 5), t.sin().reshape(2, n, 4, 5).sum(2)


@case("einsum_heads_data_x_domain", extras=[(R, (2, 3, 4, 5), True)])
def _c(x, tok):
    n = x.shape[1]
    w = torch.softmax(x[..., :4], -1).unsqueeze(1).expand(2, 3, n, 4) * 1.5  # B H N S
    return torch.einsum("bhsd,bhns->bhnd", tok, w), torch.einsum("bhnd,bhns->bhsd",
                                                                 x.unsqueeze(1) * tok[..., :1, :],
                                                                 w)


# ------------------------------------------------------------------ runner
def run_case(name, shard, n, seed):
    fn, extras, _, want_grad = CASES[name]
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(2, n, 5, generator=g, dtype=torch.float64)
    ex = [_extra(e if e[1] != ("2N", 5) else (e[0], (2 * n, 5), *e[2:]), n, g) for e in extras]
    res = {}
    xr = X.clone().requires_grad_()
    ref = _outs(fn(xr, *ex))
    x = shard(X).detach().requires_grad_()
    got = _outs(fn(x, *ex))
    weights = [e for e in ex if e.requires_grad]
    cots = [torch.randn(r.shape, generator=g, dtype=torch.float64) for r in ref]
    for k, (a, b) in enumerate(zip(got, ref)):
        res[f"{name} out {k}"] = (a.full_tensor().detach(), b.detach())
    if want_grad:
        def loss(outs):
            return sum((o * c).sum() for o, c in zip(outs, cots))

        gref = torch.autograd.grad(loss(ref), [xr, *weights], allow_unused=True)
        gg = torch.autograd.grad(loss(got), [x, *weights], allow_unused=True)
        for k, (a, b) in enumerate(zip(gg, gref)):
            if b is None:
                continue
            if k > 0:  # a plain weight's gradient is plain and complete, as one process's
                assert type(a) is torch.Tensor, (name, k, type(a))
            a = a.full_tensor() if hasattr(a, "full_tensor") else a
            res[f"{name} grad {k}"] = (a.detach(), b.detach())
    return res


def second_order(shard, n, seed):
    """d/dx of |d loss/dx|^2 (create_graph=True) through layer norm over the sharded dim (with
    a weight), a respecced product and a whole-row split view."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(2, n, 5, generator=g, dtype=torch.float64)
    W = torch.randn(n, 5, generator=g, dtype=torch.float64)

    def f(x):
        y = F.layer_norm(x * x, (n, 5), W)
        z = x[:, 1:] * x[:, : n - 1]
        v = x.unsqueeze(2).expand(2, n, 3, 5).reshape(2, 3 * n, 5).reshape(2, n, 3, 5)
        return (y ** 3).sum() + (z * z).sum() + (v.sum(2) * x).sum()

    out = {}
    for which, x in (("ref", X.clone().requires_grad_()),
                     ("got", shard(X).detach().requires_grad_())):
        gx, = torch.autograd.grad(f(x), x, create_graph=True)
        gg, = torch.autograd.grad((gx ** 2).sum(), x)
        out[which] = [t.full_tensor() if hasattr(t, "full_tensor") else t
                      for t in (gx.detach(), gg)]
    return {"second order d": (out["got"][0], out["ref"][0]),
            "second order d2": (out["got"][1], out["ref"][1])}


def errors_2d(shard, n):
    """On the 2-D mesh: a view merging the batch (one mesh dim) with the points (the other)
    into one dim has no layout (one mesh dim per tensor dim); the error says so."""
    x = shard(torch.randn(2, n, 5, dtype=torch.float64))
    try:
        x.reshape(2 * n, 5)
        return {"merge two sharded dims": "no error"}
    except NotImplementedError as e:
        return {"merge two sharded dims": f"{type(e).__name__}: {str(e).splitlines()[0]}"}


def errors(mesh, layout):
    """Layouts that cannot be reconciled: the error says what differs (1-D mesh)."""
    from torch.distributed.tensor import Shard

    from meshshard.shardtensor._aten import wrap_local

    me, n = mesh.get_coordinate()[0], sum(layout)
    rows = wrap_local(torch.ones(layout[me], n), mesh, [Shard(0)], [tuple(layout)])
    cols = wrap_local(torch.ones(n, layout[me]), mesh, [Shard(1)], [tuple(layout)])
    twice = wrap_local(torch.ones(2 * layout[me], n), mesh, [Shard(0)],
                            [tuple(2 * v for v in layout)])
    probes = {
        "different dims": lambda: rows * cols,
        "blocked against shard": lambda: rows.repeat(2, 1) + twice,  # Blocked(0x2) vs S(0)
    }
    out = {}
    for key, f in probes.items():
        try:
            f()
            out[key] = "no error"
        except (NotImplementedError, ValueError) as e:
            out[key] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return out


def all_cases(rank, world, layouts):
    """Every case on every layout in one spawn: {layout: {"cases": ..., "errors": ...}}."""
    res = {}
    for layout in layouts:
        mesh, shard, n = _mesh_and_shard(rank, world, layout)
        two_d = isinstance(layout[0], tuple)
        per = {}
        for k, name in enumerate(CASES):
            if two_d and not CASES[name][2]:
                continue
            per.update(run_case(name, shard, n, 2000 + k))
        per.update(second_order(shard, n, 11))
        res[layout] = {"cases": per,
                       "errors": errors_2d(shard, n) if two_d else errors(mesh, layout)}
    return res


def compile_case(rank, world, layouts):
    """A plain torch.compile function using the three rules, over layouts of different
    sizes: graph breaks, compilations, compiled against eager (loss and input gradients)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    calls = {"n": 0}

    def backend(gm, example_inputs):
        calls["n"] += 1
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    def f(x, w):
        n = x.shape[1]
        y = F.layer_norm(x, (n, 5), w[:n])
        z = x[:, 1:] * y[:, : n - 1]
        v = x.unsqueeze(2).expand(2, n, 3, 5).reshape(2, 3 * n, 5).reshape(2, n, 3, 5)
        # the amax term makes the loss Replicate: a Partial output of a compiled region meets
        # a Replicate tangent, which the class cannot coerce yet (no
        # __coerce_same_metadata_as_tangent__); see the hand-over of issue 22-norm
        return (y * y.cos()).sum() + z.sum() + (v.sum(2) * y).sum() + x.amax()

    cf = torch.compile(f, backend=backend)
    pairs = []
    for layout in layouts:
        _, shard, n = _mesh_and_shard(rank, world, layout)
        g = torch.Generator().manual_seed(3)
        X = torch.randn(2, n, 5, generator=g, dtype=torch.float64)
        w = torch.randn(16, 5, generator=g, dtype=torch.float64, requires_grad=True)
        out = {}
        for tag, fn in (("eager", f), ("compiled", cf)):
            x = shard(X).detach().requires_grad_()
            loss = fn(x, w)
            gx, gw = torch.autograd.grad(loss, [x, w])
            out[tag] = [loss.full_tensor().detach(), gx.full_tensor(), gw]
        pairs.append(out)
    return {"pairs": pairs, "compiles": calls["n"],
            "graph breaks": sum(counters["graph_break"].values()),
            "break reasons": [str(k) for k in counters["graph_break"]]}
