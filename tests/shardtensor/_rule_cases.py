"""Rank functions for ``test_aten_ops.py``: reductions, indexing, shape ops and linalg on the
aten-level ShardTensor (``meshshard.shardtensor._aten``), against one process on the full data.

A case is ``fn(x, *extras)``: ``x`` is (2, N, 5), sharded on dim 1 (on a 2-D mesh also on dim 0);
``extras`` are plain tensors, those made with ``grad=True`` are weights that need a gradient.
For every layout each case returns, per output, (sharded full_tensor, reference), and per
gradient input (x and weights) the same, fp64."""

from __future__ import annotations

import math

import torch

CASES: dict = {}


def case(name, extras=(), mesh2d=True, grad=True):
    def deco(fn):
        CASES[name] = (fn, extras, mesh2d, grad)
        return fn

    return deco


def _i(*v):
    return torch.tensor(v, dtype=torch.int64)


# extras: (kind, spec) made per layout from N (the sharded extent)
R = "randn"


# ------------------------------------------------------------------ reductions
@case("all_any", grad=False)
def _c(x):
    pos = x > -0.5
    return (pos.all(), pos.any(), pos.all(1), pos.any(1, keepdim=True), pos.all(2),
            (x == x).all(), (x > 100).any(), pos.all(dim=(0, 1)))


@case("softmax_over_sharded_dim")
def _c(x):
    t = x.masked_fill(x > 1.0, float("-inf"))  # masked entries, as in attention: weight 0
    return (x.softmax(1) * x, torch.log_softmax(x, 1), torch.softmax(t, 1) * 2,
            x.softmax(2), (x * 3).log_softmax(-1))


@case("amax_amin")
def _c(x):
    return x.amax(1) + x.amin((0, 1)), x.amax(), x.amin(2, keepdim=True) * x


@case("max_min_dim")
def _c(x):
    v, i = x.max(1)
    w, j = x.min(1, keepdim=True)
    u, k = x.max(2)
    return v * 2, i, w * 3, j, u, k


@case("max_min_all")
def _c(x):
    return x.max() + 2 * x.min()


@case("ties_owner_rule", mesh2d=True)
def _c(x):
    t = (x * 1.5).round()  # many equal values across ranks: the lowest global index wins
    v, i = t.max(1)
    w, j = t.min(1)
    return v * x.sum(1), i, w, j, t.argmax(1), t.argmin(), t.amax(1) * x.sum(1)


@case("argmax_argmin", grad=False)
def _c(x):
    return x.argmax(1), x.argmin(1, keepdim=True), x.argmax(), x.argmin(), x.argmax(2)


@case("var_std")
def _c(x):
    return (x.var(1), x.std(1, keepdim=True, correction=0), x.var(), x.var(2),
            x.std((0, 1), correction=2))


@case("norms")
def _c(x):
    vn = torch.linalg.vector_norm
    return (x.norm(dim=1), vn(x, 3, dim=(1, 2)), vn(x, math.inf, dim=1), vn(x, 1),
            vn(x, -math.inf, dim=(0, 1)), vn(x, 0, dim=1) + x.sum(1))


@case("logsumexp")
def _c(x):
    return (torch.logsumexp(x, 1), torch.logsumexp(x * 2, (0, 1), keepdim=True),
            torch.logsumexp(x, 2))


@case("cumsum")
def _c(x):
    return x.cumsum(2), x.cumsum(1) * x, x.cumsum(0)


# ------------------------------------------------------------------ indexing
@case("index", extras=[("idx", 5, (2, 0, 4, 4))], mesh2d=True)
def _c(x, idx):
    return x[:, :, idx] * 2, x[:, :, _i(1, 0)][..., None] * x[..., :1, None]


@case("index_dim0", extras=[("idx", 2, (1, 0, 1))], mesh2d=False)
def _c(x, idx):
    return x[idx] * 2, x[idx, :, _i(3, 1, 0)]


@case("index_select", extras=[("idx", 5, (4, 0, 0, 2))])
def _c(x, idx):
    return x.index_select(2, idx), x.index_select(2, idx[:1]) * x


@case("gather_scatter", extras=[("gidx", 5, 3)])
def _c(x, gidx):
    g = x.gather(2, gidx)
    sa = torch.zeros(x.shape[0], x.shape[1], 5, dtype=x.dtype).scatter_add(2, gidx, g * 2)
    s = x.scatter(2, gidx[..., :1], x[..., :1] * 3)
    sv = x.scatter(2, gidx[..., 1:2], 0.5)
    return g, sa, s, sv


@case("scatter_reduce", extras=[("gidx", 5, 3)])
def _c(x, gidx):
    src = x[..., :3] * 2
    return (x.scatter_reduce(2, gidx, src, "sum"), x.scatter_reduce(2, gidx, src, "amax"),
            x.scatter_reduce(2, gidx, src, "mean", include_self=False))


@case("gather_index_select_sharded_dim", extras=[("nidx", (2, 4, 5)), ("nidx", (6,))])
def _c(x, gi, ii):
    return x.gather(1, gi) * 2, x.index_select(1, ii), x.index_select(1, ii[:1]).sum(1)


@case("index_put_add", extras=[("idx", 2, (1, 0, 1)), ("idx", 5, (3, 3, 0))], mesh2d=False)
def _c(x, i0, i2):
    a = x.index_put((i0,), x[0:1] * 3, accumulate=True)
    b = x.transpose(0, 2).index_put((i2,), x.transpose(0, 2)[:3] * 2).transpose(0, 2)
    c = x.index_add(2, i2, x[..., :3] * 0.5)
    return a, b, c


@case("masked_where", extras=[(R, (2, "N", 5), True), (R, (), True)])
def _c(x, y, v):
    return (x.masked_fill(x > 0.3, 1.5), x.masked_fill(x < 0, v), torch.where(x > 0, x, y * 2),
            torch.where(y > 0, x * x, 0.0))


@case("slice_select")
def _c(x):
    n = x.shape[1]
    return (x[:, 1 : n - 1] * 2, x[:, ::2], x[:, 2:].sum(1), x[:, n // 2], x[:, -1] * x[:, 0],
            x[1] * 3, x.narrow(1, 1, n - 2).amax(1))


# ------------------------------------------------------------------ shape ops
@case("cat_sharded_dim", extras=[(R, (2, 3, 5), True)])
def _c(x, w):
    return torch.cat([x, x * 2], 1), torch.cat([w, x.sin(), w * 2], 1).sum(1), torch.cat([x, x], 2)


@case("stack_unbind", extras=[(R, (2, "N", 5), True)], mesh2d=False)
def _c(x, y):
    return (torch.stack([x, x.sin()], 0).sum(0), torch.stack([x, y], 3), torch.unbind(x, 0)[1],
            torch.unbind(x, 2)[3] * 2)


@case("repeat_flip_roll")
def _c(x):
    return (x.repeat(1, 2, 1) * 2, x.repeat(3, 1, 1, 2), x.repeat(1, 3, 1).sum(1), x.flip(2),
            x.flip(1) * 2, x.roll(2, 1), x.roll((1, -1), (2, 1)))


@case("view_split_sharded_dim", extras=[(R, (2, 5, "N"), True)], mesh2d=False)
def _c(x, w):
    n = x.shape[1]
    y = x.reshape(2, n * 5).view(2, 5, n)  # rows of n elements: shard boundaries move
    return y * w, (y * w).reshape(2, n, 5) + x, y.sum(2)


# ------------------------------------------------------------------ linalg
@case("einsum_matmul", extras=[(R, (5, 4), True), (R, (5,), True), (R, (2, 4, "N"), True)],
      mesh2d=False)
def _c(x, w, v, u):
    return (torch.einsum("bnc,bnd->bcd", x, x), torch.einsum("bnc,cd->bnd", x, w),
            torch.einsum("bnc,bnc->bn", x, x.cos()), x @ v, u @ x, x.transpose(1, 2) @ x,
            torch.matmul(x[0], v), torch.mv(x[1], v), torch.dot(x[0, :, 0], x[1, :, 1]))


# ------------------------------------------------------------------ runner
def _extra(spec, n, g):
    kind = spec[0]
    if kind == "nidx":  # indices into the sharded dim
        return torch.randint(0, n, spec[1], generator=g)
    if kind in ("idx", "gidx"):
        high, size = spec[1], spec[2]
        if isinstance(size, tuple):
            return torch.tensor(size, dtype=torch.int64)
        return torch.randint(0, high, (2, n, size), generator=g)
    shape = tuple(n if s == "N" else s for s in spec[1])
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    return t.requires_grad_(len(spec) > 2 and spec[2])


def _mesh_and_shard(rank, world, layout):
    """(mesh, shard(x_full) -> sharded leaf). ``layout``: sizes on dim 1, or for a 2-D mesh
    ((sizes on dim 1 over mesh dim 0), (sizes on dim 0 over mesh dim 1))."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from meshshard.shardtensor._aten import wrap_local

    if isinstance(layout[0], tuple):
        s1, s0 = layout
        mesh = init_device_mesh("cpu", (len(s1), len(s0)))
        c1, c0 = mesh.get_coordinate()

        def shard(t):
            o1, o0 = sum(s1[:c1]), sum(s0[:c0])
            loc = t[o0 : o0 + s0[c0], o1 : o1 + s1[c1]].detach().clone()
            return wrap_local(loc, mesh, [Shard(1), Shard(0)], [s1, s0])

        return mesh, shard, sum(s1)
    mesh = init_device_mesh("cpu", (world,))
    me = rank

    def shard(t):
        o = sum(layout[:me])
        loc = t[:, o : o + layout[me]].detach().clone()
        return wrap_local(loc, mesh, [Shard(1)], [tuple(layout)])

    return mesh, shard, sum(layout)


def _outs(o):
    return list(o) if isinstance(o, (tuple, list)) else [o]


def run_case(name, shard, n, seed):
    fn, extras, _, want_grad = CASES[name]
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(2, n, 5, generator=g, dtype=torch.float64)
    ex = [_extra(e, n, g) for e in extras]
    res = {}
    xr = X.clone().requires_grad_()
    ref = _outs(fn(xr, *ex))
    x = shard(X).detach().requires_grad_()
    got = _outs(fn(x, *ex))
    weights = [e for e in ex if e.requires_grad]
    cots = [torch.randn(r.shape, generator=g, dtype=torch.float64)
            if r.dtype.is_floating_point else None for r in ref]
    for k, (a, b) in enumerate(zip(got, ref)):
        res[f"{name} out {k}"] = (a.full_tensor().detach(), b.detach())
    if want_grad:
        def loss(outs):
            return sum((o * c).sum() for o, c in zip(outs, cots) if c is not None)

        gref = torch.autograd.grad(loss(ref), [xr, *weights], allow_unused=True)
        gg = torch.autograd.grad(loss(got), [x, *weights], allow_unused=True)
        for k, (a, b) in enumerate(zip(gg, gref)):
            if b is None:
                continue
            a = a.full_tensor() if hasattr(a, "full_tensor") else a
            res[f"{name} grad {k}"] = (a.detach(), b.detach())
    return res


def second_order(shard, n, seed):
    """d/dx of |d loss/dx|^2 (create_graph=True) through var, logsumexp, max.dim, gather and
    (log-)softmax over the sharded dim."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(2, n, 5, generator=g, dtype=torch.float64)
    gidx = torch.randint(0, 5, (2, n, 2), generator=g)

    def f(x):
        return ((x.var(1) * torch.logsumexp(x, 1)).sum() + (x.max(1).values ** 2).sum()
                + (x.gather(2, gidx) ** 3).sum() + (x.cumsum(2) * x).sum()
                + torch.linalg.vector_norm(x, dim=(0, 1)).sum()
                + (x.softmax(1) ** 2).sum() + (x.log_softmax(1) * x).sum())

    out = {}
    for which, x in (("ref", X.clone().requires_grad_()),
                     ("got", shard(X).detach().requires_grad_())):
        gx, = torch.autograd.grad(f(x), x, create_graph=True)
        gg, = torch.autograd.grad((gx ** 2).sum(), x)
        out[which] = [t.full_tensor() if hasattr(t, "full_tensor") else t
                      for t in (gx.detach(), gg)]
    return {"second order d": (out["got"][0], out["ref"][0]),
            "second order d2": (out["got"][1], out["ref"][1])}


def errors(shard, n):
    """Layouts the rules cannot do: a clear NotImplementedError naming the op (or IndexError)."""
    X = torch.randn(2, n, 5, dtype=torch.float64)
    x = shard(X)
    gi = torch.zeros(2, n, 5, dtype=torch.int64)
    probes = {
        "gather with a sharded index along the sharded dim": lambda: x.gather(1, shard(gi)),
        "index tensor on the sharded dim": lambda: x[:, _i(0, 1)],
        "boolean mask": lambda: x[X > 0],
        "unbind along the sharded dim": lambda: x.unbind(1),
        "unknown op": lambda: torch.sort(x, dim=1),
        "select out of range": lambda: x[:, n + 3],
        "cat along the shard dim of a blocked": lambda: torch.cat([x.repeat(1, 2, 1)] * 2, 1),
    }
    out = {}
    for key, f in probes.items():
        try:
            f()
            out[key] = "no error"
        except (NotImplementedError, IndexError) as e:
            out[key] = str(e).splitlines()[0]
    return out


def all_cases(rank, world, layouts, names=None):
    """Every case on every layout in one spawn: {layout: {key: (got, want)}}, plus errors."""
    res = {}
    for layout in layouts:
        _, shard, n = _mesh_and_shard(rank, world, layout)
        per = {}
        for k, name in enumerate(names or CASES):
            if isinstance(layout[0], tuple) and not CASES[name][2]:
                continue
            per.update(run_case(name, shard, n, 1000 + k))
        per.update(second_order(shard, n, 7))
        res[layout] = {"cases": per, "errors": errors(shard, n)}
    return res


def compile_case(rank, world, layouts):
    """One plain torch.compile function mixing these ops, over layouts of different sizes:
    graph breaks, compilations, and compiled against eager (outputs and input gradients)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    calls = {"n": 0}

    def backend(gm, example_inputs):
        calls["n"] += 1
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    def f(x, gidx, w):
        v, i = x.max(1)
        y = torch.cat([x, x.gather(2, gidx) @ w[:2]], 2)
        z = torch.logsumexp(y, 1) + y.var(1) + torch.linalg.vector_norm(y, dim=1)
        t = torch.where(x > 0, x.cumsum(2), x.amax(2, keepdim=True))
        u = torch.cat([t, t * 2], 1).sum(1)
        return (z.sum() + (v * i).sum() + u.sum() + x.index_select(2, _i(4, 0)).pow(2).sum()
                + (x[:, 1:] ** 2).sum())

    cf = torch.compile(f, backend=backend)
    pairs = []
    for layout in layouts:
        _, shard, n = _mesh_and_shard(rank, world, layout)
        g = torch.Generator().manual_seed(3)
        X = torch.randn(2, n, 5, generator=g, dtype=torch.float64)
        gidx = torch.randint(0, 5, (2, n, 2), generator=g)
        w = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
        out = {}
        for tag, fn in (("eager", f), ("compiled", cf)):
            x = shard(X).detach().requires_grad_()
            gl = shard(gidx)
            loss = fn(x, gl, w)
            gx, gw = torch.autograd.grad(loss, [x, w])
            out[tag] = [loss.full_tensor().detach(), gx.full_tensor(), gw]
        pairs.append(out)
    return {"pairs": pairs, "compiles": calls["n"],
            "graph breaks": sum(counters["graph_break"].values()),
            "break reasons": [str(k) for k in counters["graph_break"]]}
