"""The rule families' oracle cases on one sharded input, and the one spawn of ranks that runs
every family's cases (``tests/shardtensor/_<family>_fns.py``) for ``test_<family>.py``.

A case is ``fn(x, *extras)``: ``x`` is (2, N, 5), sharded on dim 1 (on a 2-D mesh also on dim 0);
``extras`` are plain tensors, those made with ``grad=True`` are weights that need a gradient.
For every layout each case returns, per output, (sharded full_tensor, reference), and per
gradient input (x and weights) the same, fp64. A family may add a second-order case
(``create_graph=True``) and probes: layouts its rules cannot do, whose error must say why.

On 2, 3 and 4 gloo ranks, layouts with an empty and a one-row shard and a 2x2 mesh (one spawn
per world size runs every family's cases and probes; ``test_<family>.py`` checks its own): every
output, and the gradients of a random projection of them w.r.t. the sharded leaf and the plain
weights (``torch.autograd.grad``), equal one process in fp64.
"""

from __future__ import annotations

import importlib

import torch

#: the families with cases here, by the rules file they test (``_<family>_fns.py``)
FAMILIES = ("reduction", "norm", "index", "slice", "shape", "view", "linalg", "pointwise", "tp",
            "fallback")
# sizes of the sharded dim per rank; a pair of tuples is a 2-D mesh (2 x 2): dim 1 over mesh
# dim 0 and dim 0 over mesh dim 1
LAYOUTS = {2: [(3, 5), (0, 8)], 3: [(1, 0, 6)], 4: [(2, 1, 0, 5), ((3, 5), (1, 1))]}
# fp64: the largest relative difference from one process over every case and layout is
# 3.0e-12 (the weight gradient of the layer norm offset by 1e4: its inputs' own rounding),
# <= 1.8e-15 elsewhere; 1e-10 leaves room for other summation orders
RTOL = 1e-10

# family -> name -> (fn, extras, mesh2d, grad, seed, plain_grads)
CASES: dict = {f: {} for f in FAMILIES}
SECOND_ORDER: dict = {}  # family -> (make_f(n, g) -> f, seed)
PROBES: dict = {f: {} for f in FAMILIES}  # family -> name -> (probe, on, fragment, prefix)


def case(family, name, *, seed, extras=(), mesh2d=True, grad=True, plain_grads=False):
    """Register ``fn(x, *extras)``; ``seed`` draws its inputs; ``mesh2d``: also on the 2x2
    mesh; ``grad``: compare the gradients of a random projection of the outputs too;
    ``plain_grads``: the plain weights' gradients are plain tensors, complete on every rank."""
    def deco(fn):
        CASES[family][name] = (fn, extras, mesh2d, grad, seed, plain_grads)
        return fn

    return deco


def second_order(family, *, seed):
    """Register ``make_f(n, g) -> f``: d/dx of |d f(x)/dx|^2 (``create_graph=True``)."""
    def deco(make_f):
        SECOND_ORDER[family] = (make_f, seed)
        return make_f

    return deco


def probe(family, name, fragment, *, on="all", prefix=False):
    """Register ``fn(ctx)`` that must raise: its error, ``"Type: first line"``, contains
    ``fragment`` (starts with it if ``prefix``); ``on``: "all", "1d" or "2d" meshes."""
    def deco(fn):
        PROBES[family][name] = (fn, on, fragment, prefix)
        return fn

    return deco


def i64(*v):
    return torch.tensor(v, dtype=torch.int64)


# extras: (kind, spec) made per layout from N (the sharded extent)
R = "randn"


def _extra(spec, n, g):
    kind = spec[0]
    if kind == "nidx":  # indices into the sharded dim
        return torch.randint(0, n, spec[1], generator=g)
    if kind in ("idx", "gidx"):
        high, size = spec[1], spec[2]
        if isinstance(size, tuple):
            return torch.tensor(size, dtype=torch.int64)
        return torch.randint(0, high, (2, n, size), generator=g)
    shape = tuple({"N": n, "2N": 2 * n}.get(s, s) for s in spec[1])
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    return t.requires_grad_(len(spec) > 2 and spec[2])


class Layout:
    """A layout on this rank: the mesh, ``shard(x_full)`` -> sharded leaf, ``n`` the sharded
    extent. ``layout``: sizes on dim 1, or for a 2-D mesh ((sizes on dim 1 over mesh dim 0),
    (sizes on dim 0 over mesh dim 1))."""

    def __init__(self, rank, world, layout):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard

        from meshshard.shardtensor._aten import wrap_local

        self.layout, self.two_d = layout, isinstance(layout[0], tuple)
        if self.two_d:
            s1, s0 = layout
            self.mesh = init_device_mesh("cpu", (len(s1), len(s0)))
            c1, c0 = self.mesh.get_coordinate()

            def shard(t):
                o1, o0 = sum(s1[:c1]), sum(s0[:c0])
                loc = t[o0 : o0 + s0[c0], o1 : o1 + s1[c1]].detach().clone()
                return wrap_local(loc, self.mesh, [Shard(1), Shard(0)], [s1, s0])

            self.shard, self.n = shard, sum(s1)
            return
        self.mesh = init_device_mesh("cpu", (world,))

        def shard(t):
            o = sum(layout[:rank])
            loc = t[:, o : o + layout[rank]].detach().clone()
            return wrap_local(loc, self.mesh, [Shard(1)], [tuple(layout)])

        self.shard, self.n = shard, sum(layout)

    def sample(self):
        """A random full x (2, N, 5) and its sharded leaf."""
        X = torch.randn(2, self.n, 5, dtype=torch.float64)
        return X, self.shard(X)


def _outs(o):
    return list(o) if isinstance(o, (tuple, list)) else [o]


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def run_case(family, name, shard, n):
    fn, extras, _, want_grad, seed, plain_grads = CASES[family][name]
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
            if plain_grads and k > 0:  # plain and complete, as one process's
                assert type(a) is torch.Tensor, (name, k, type(a))
            res[f"{name} grad {k}"] = (_full(a).detach(), b.detach())
    return res


def run_second_order(family, shard, n):
    make_f, seed = SECOND_ORDER[family]
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(2, n, 5, generator=g, dtype=torch.float64)
    f = make_f(n, g)
    out = {}
    for which, x in (("ref", X.clone().requires_grad_()),
                     ("got", shard(X).detach().requires_grad_())):
        gx, = torch.autograd.grad(f(x), x, create_graph=True)
        gg, = torch.autograd.grad((gx ** 2).sum(), x)
        out[which] = [_full(t) for t in (gx.detach(), gg)]
    return {"second order d": (out["got"][0], out["ref"][0]),
            "second order d2": (out["got"][1], out["ref"][1])}


def run_probes(family, ctx):
    out = {}
    for key, (fn, on, _, _) in PROBES[family].items():
        if on != "all" and on != ("2d" if ctx.two_d else "1d"):
            continue
        try:
            fn(ctx)
            out[key] = "no error"
        except (NotImplementedError, IndexError, ValueError) as e:
            out[key] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return out


def _load_families():
    for family in FAMILIES:
        importlib.import_module(f"tests.shardtensor._{family}_fns")


def all_cases(rank, world, layouts, families=FAMILIES):
    """Rank function: every family's cases on every layout in one spawn:
    {layout: {family: {"cases": {key: (got, want)}, "errors": {probe: text}}}}."""
    _load_families()
    res = {}
    for layout in layouts:
        ctx = Layout(rank, world, layout)
        res[layout] = {}
        for family in families:
            per = {}
            for name, spec in CASES[family].items():
                if ctx.two_d and not spec[2]:
                    continue
                per.update(run_case(family, name, ctx.shard, ctx.n))
            if family in SECOND_ORDER:
                per.update(run_second_order(family, ctx.shard, ctx.n))
            res[layout][family] = {"cases": per, "errors": run_probes(family, ctx)}
    return res


def _reports(world):
    from tests.shardtensor._oracle import ranks_once

    return ranks_once(all_cases, world, LAYOUTS[world], timeout=300, collective_timeout=60)


def check_cases(family, world):
    """Every case of ``family`` ran on every layout and equals one process."""
    from tests.shardtensor._oracle import close

    _load_families()
    for rank, per_layout in enumerate(_reports(world)):
        for layout, per_family in per_layout.items():
            cases = per_family[family]["cases"]
            two_d = isinstance(layout[0], tuple)
            for name, (_, _, mesh2d, grad, *_) in CASES[family].items():
                if two_d and not mesh2d:
                    continue
                assert f"{name} out 0" in cases, (rank, layout, name)
                if grad:
                    assert f"{name} grad 0" in cases, (rank, layout, name)
            if family in SECOND_ORDER:
                assert "second order d2" in cases
            for key, (got, want) in cases.items():
                close(got, want, f"rank {rank} layout {layout} {key}", RTOL)


def check_probes(family, world):
    """Each probe of ``family`` that applies to a layout raised, and its error says why."""
    _load_families()
    for rank, per_layout in enumerate(_reports(world)):
        for layout, per_family in per_layout.items():
            on = "2d" if isinstance(layout[0], tuple) else "1d"
            want = {k: v for k, v in PROBES[family].items() if v[1] in ("all", on)}
            errors = per_family[family]["errors"]
            assert set(errors) == set(want), (rank, layout, family)
            for key, text in errors.items():
                _, _, fragment, prefix = want[key]
                ok = text.startswith(fragment) if prefix else fragment in text
                assert ok, (rank, layout, key, text)
