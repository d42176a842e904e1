"""Rank functions for ``test_layout.py``: from_local's checks, redistribute (values and
gradients to second order, eager and compiled) and an N-D mesh Transolver on the
ShardTensor, each against one process on the full data (fp64)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial, Replicate, Shard


def _full(n: int, seed: int, cols: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, cols, generator=g, dtype=torch.float64)


def _rows(t: torch.Tensor, sizes, rank: int) -> torch.Tensor:
    off = sum(sizes[:rank])
    return t[off : off + sizes[rank]]


def _error_of(fn) -> str:
    try:
        fn()
    except (ValueError, TypeError, NotImplementedError) as e:
        return f"{type(e).__name__}: {e}"
    return ""


def layout_cases(rank: int, world: int, sizes: tuple, other: tuple) -> dict:
    """Each value: (got, want) tensors, or an error string ('' = no error)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor._aten import from_local, redistribute

    mesh = init_device_mesh("cpu", (world,))
    n = sum(sizes)
    X, W = _full(n, 1), _full(n, 2)
    out: dict = {}
    # sizes inferred by one all-gather; declared sizes checked on every rank
    x = from_local(_rows(X, sizes, rank).clone(), mesh, [Shard(0)])
    out["inferred sizes"] = (torch.tensor(x.sharding_sizes()), torch.tensor(sizes))
    wrong = list(sizes)
    big = wrong.index(max(wrong))
    wrong[big] -= 1
    wrong[big - 1] += 1
    out["declared sizes that disagree"] = _error_of(
        lambda: from_local(_rows(X, sizes, rank), mesh, [Shard(0)], wrong))
    out["per-rank shapes form"] = (
        torch.tensor(from_local(_rows(X, sizes, rank), mesh, [Shard(0)],
                                [torch.Size([s, 3]) for s in sizes]).sharding_sizes()),
        torch.tensor(sizes))
    loss = (x.detach() ** 2).sum()  # a Partial scalar: formatting reduces it (collective)
    out["format of a Partial scalar"] = (torch.tensor(float(f"{loss:.17e}")),
                                         torch.tensor(float(f"{(X ** 2).sum():.17e}")))
    # Partial avg/max/min pieces: reduced at once (values and each piece's gradient share)
    pieces = [_full(n, 10 + r).round() for r in range(world)]  # rounded: ties across ranks
    stack = torch.stack(pieces)
    for op, ref in (("avg", lambda s: s.mean(0)), ("max", lambda s: s.amax(0)),
                    ("min", lambda s: s.amin(0))):
        leaf = pieces[rank].clone().requires_grad_()
        y = from_local(leaf, mesh, [Partial(op)])
        (y.full_tensor() * W).sum().backward()
        st = stack.clone().requires_grad_()
        (ref(st) * W).sum().backward()
        out[f"Partial {op} value"] = (y.full_tensor().detach(), ref(stack))
        out[f"Partial {op} gradient"] = (leaf.grad, st.grad[rank])
    out["Partial prod"] = _error_of(lambda: from_local(X, mesh, [Partial("prod")]))
    out["a ShardTensor given"] = _error_of(lambda: from_local(x, mesh, [Shard(0)]))
    out["bad target sizes"] = _error_of(lambda: redistribute(x, [Shard(0)], [n + 1] + [0] * (
        world - 1)))

    def leaf():
        return from_local(_rows(X, sizes, rank).clone(), mesh, [Shard(0)], sizes).detach() \
            .requires_grad_()

    # every layout change: the value, then d/dx of sum(W * y**3) and the second order
    targets = {
        "Shard -> Shard (new sizes)": ([Shard(0)], [other]),
        "Shard -> Replicate": ([Replicate()], None),
        "Shard -> Partial": ([Partial()], None),
        "Shard -> Shard(1)": ([Shard(1)], None),
    }
    for name, (pl, sz) in targets.items():
        xs = leaf()
        y = redistribute(xs, pl, sz)
        out[name + ": value"] = (y.full_tensor(), X)
        yl = y.full_tensor()
        loss = (W * yl ** 3).sum()
        g, = torch.autograd.grad(loss, xs, create_graph=True)
        out[name + ": grad"] = (g.full_tensor(), 3 * W * X ** 2)
        gg, = torch.autograd.grad((g ** 2).sum(), xs)
        out[name + ": 2nd order"] = (gg.full_tensor(), 2 * (3 * W * X ** 2) * 6 * W * X)
    # from Replicate and Partial back to Shard
    r = from_local(X.clone(), mesh, [Replicate()]).detach().requires_grad_()
    y = redistribute(r, [Shard(0)], [other])
    out["Replicate -> Shard: local"] = (y.to_local(), _rows(X, other, rank))
    gr, = torch.autograd.grad((y * y).sum(), r)
    out["Replicate -> Shard: grad"] = (gr.full_tensor(), 2 * X)
    part = X / world
    p = from_local(part.clone(), mesh, [Partial()]).detach().requires_grad_()
    y = redistribute(p, [Shard(0)], [other])
    out["Partial -> Shard: local"] = (y.to_local(), _rows(X, other, rank))
    gp, = torch.autograd.grad((W.narrow(0, sum(other[:rank]), other[rank]) * y.to_local()).sum(),
                              p)
    out["Partial -> Shard: grad"] = (gp.full_tensor(), W)
    return out


def nd_mesh_case(rank: int, world: int, batch_sizes: tuple, point_sizes: tuple) -> dict:
    """The reference Transolver on a 2-D mesh: batch sharded on mesh dim 0 (or replicated when
    ``batch_sizes`` is None), points unevenly on mesh dim 1; output, weight gradients and the
    gradient w.r.t. the coordinates against one process."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.shardtensor._aten import from_local

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("data", "domain"))
    cd, cp = mesh.get_coordinate()
    n = sum(point_sizes)
    b = 2
    g = torch.Generator().manual_seed(n)
    X, F, Y = (torch.randn(b, n, k, generator=g, dtype=torch.float64) for k in (3, 1, 1))
    torch.manual_seed(0)
    model = Transolver(space_dim=3, fun_dim=1, out_dim=1, n_hidden=16, n_layers=2, heads=2,
                       slices=8).to(torch.float64)
    xr = X.clone().requires_grad_()
    ref = ((model(xr, F) - Y) ** 2).mean()
    ref_gx, = torch.autograd.grad(ref, xr, retain_graph=True)
    ref_gw = torch.autograd.grad(ref, list(model.parameters()))
    off = sum(point_sizes[:cp])

    def piece(t):
        t = t[:, off : off + point_sizes[cp]]
        if batch_sizes is not None:
            t = t[sum(batch_sizes[:cd]) : sum(batch_sizes[: cd + 1])]
        return t.clone()

    if batch_sizes is None:
        pl, sz = [Replicate(), Shard(1)], [None, point_sizes]
    else:
        pl, sz = [Shard(0), Shard(1)], [batch_sizes, point_sizes]
    x = from_local(piece(X), mesh, pl, sz).detach().requires_grad_()
    f, y = (from_local(piece(t), mesh, pl, sz) for t in (F, Y))
    loss = ((model(x, f) - y) ** 2).mean()
    gx, = torch.autograd.grad(loss, x, retain_graph=True)
    gw = torch.autograd.grad(loss, list(model.parameters()))
    out = {"loss": (loss.full_tensor(), ref.detach()), "grad x": (gx.full_tensor(), ref_gx)}
    for k, (a, r) in enumerate(zip(gw, ref_gw)):
        out[f"grad w{k}"] = (a, r)
    return out


def compile_redistribute_case(rank: int, world: int, layouts: list) -> dict:
    """``torch.compile`` of a function that re-splits its input and differentiates through it:
    graph breaks, compilations and results against eager, over several layouts."""
    from meshshard.testing.inductor import private_inductor_cache

    private_inductor_cache()
    import torch._dynamo as dynamo
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor._aten import from_local, redistribute

    mesh = init_device_mesh("cpu", (world,))
    dynamo.reset()
    compiles = [0]

    def backend(gm, example_inputs):
        compiles[0] += 1
        return gm.forward

    def fn(x, new_sizes):
        y = redistribute(x, [Shard(0)], [new_sizes])
        return (y.sin() * 2).sum(0)

    cfn = torch.compile(fn, backend=backend, fullgraph=True)
    per = []
    for sizes, other in layouts:
        X = _full(sum(sizes), len(per) + 7)
        res = {}
        for name, f in (("eager", fn), ("compiled", cfn)):
            x = from_local(_rows(X, sizes, rank).clone(), mesh, [Shard(0)], sizes) \
                .detach().requires_grad_()
            out = f(x, tuple(other))
            g, = torch.autograd.grad(out.full_tensor().sum(), x)
            res[name] = (out.full_tensor().detach(), g.full_tensor())
        per.append(res)
    return {"compiles": compiles[0], "per layout": per}
