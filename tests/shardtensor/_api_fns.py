"""Rank functions for ShardTensor API and bad-input tests."""

from __future__ import annotations

import traceback

import torch


def _mesh(ws):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (ws,))


def _catch(fn):
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def construction(rank, ws, sizes):
    from meshshard.shardtensor import Replicate, Shard, from_local, scatter

    mesh = _mesh(ws)
    N = sum(sizes)
    full = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
    off = sum(sizes[:rank])
    local = full[off : off + sizes[rank]]
    out = {}
    st = from_local(local, mesh, [Shard(0)])  # inferred with one collective
    out["inferred"] = st.sharding_sizes()
    out["shape"] = tuple(st.shape)
    out["local_shape"] = tuple(st.to_local().shape)
    out["sharding_shapes"] = [tuple(s) for s in st.sharding_shapes()[0]]
    out["full_equal"] = torch.equal(st.full_tensor(), full)
    # scatter from rank 0 with the given sizes
    sc = scatter(full if rank == 0 else None, mesh, sizes, src=0)
    out["scatter_equal"] = torch.equal(sc.to_local(), local)
    # redistribute: rebalance to a caller-chosen layout, then to Replicate and back
    new = tuple(reversed(sizes))
    rb = st.redistribute(sizes=list(new))
    noff = sum(new[:rank])
    out["rebalance_equal"] = torch.equal(rb.to_local(), full[noff : noff + new[rank]])
    rep = st.redistribute([Replicate()])
    out["replicate_equal"] = torch.equal(rep.to_local(), full)
    back = rep.redistribute([Shard(0)], sizes=list(sizes))
    out["back_equal"] = torch.equal(back.to_local(), local)
    # Partial -> Replicate through a reduction, and sum == plain sum
    out["sum"] = st.sum().item()
    out["sum_ref"] = full.sum().item()
    # Partial placements: sum, avg, max reduce across ranks
    from meshshard.shardtensor import Partial

    v = torch.tensor([float(rank + 1), float(-rank)])
    for op in ("sum", "avg", "max"):
        out[f"partial_{op}"] = from_local(v, mesh, [Partial(op)]).full_tensor().tolist()
    # gradients through redistribute (rebalance) reach the original local rows
    leaf = local.clone().requires_grad_(True)
    st2 = from_local(leaf, mesh, [Shard(0)], sizes)
    (st2.redistribute(sizes=list(new)) * 2).sum().backward()
    out["rebalance_grad_ok"] = torch.equal(leaf.grad, torch.full_like(leaf, 2.0))
    # a ShardTensor leaf's .grad is a ShardTensor in the leaf's layout
    st3 = from_local(local.clone(), mesh, [Shard(0)], sizes).requires_grad_()
    (st3.redistribute(sizes=list(new)) * 2).sum().backward()
    out["grad_is_shardtensor"] = (type(st3.grad).__name__ == "ShardTensor"
                                  and st3.grad.placements == st3.placements
                                  and torch.equal(st3.grad.to_local(), torch.full_like(local, 2.0)))
    return out


def bad_declared_sizes(rank, ws):
    from meshshard.shardtensor import Shard, from_local

    mesh = _mesh(ws)
    local = torch.zeros(3 if rank == 0 else 5, 2)
    # every rank declares (4, 4): wrong on both; with validate=True all ranks raise, none hang
    return _catch(lambda: from_local(local, mesh, [Shard(0)], [4, 4]))


def bad_declared_one_rank(rank, ws):
    from meshshard.shardtensor import Shard, from_local

    mesh = _mesh(ws)
    local = torch.zeros(3 if rank == 0 else 5, 2)
    # rank 1 declares the truth, rank 0 a lie that matches its own local shape
    sizes = [3, 6] if rank == 0 else [3, 5]
    return _catch(lambda: from_local(local, mesh, [Shard(0)], sizes))


def bad_shapes_outside_shard_dim(rank, ws):
    from meshshard.shardtensor import Shard, from_local

    mesh = _mesh(ws)
    local = torch.zeros(3, 2 if rank == 0 else 4)
    return _catch(lambda: from_local(local, mesh, [Shard(0)]))


def bad_misc(rank, ws):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Replicate, Shard, from_local

    mesh = _mesh(ws)
    sizes = (3, 5)
    a = from_local(torch.ones(sizes[rank], 2), mesh, [Shard(0)], sizes)
    out = {}
    out["placements_vs_mesh"] = _catch(
        lambda: from_local(torch.ones(2, 2), mesh, [Shard(0), Replicate()])
    )
    out["shard_dim_range"] = _catch(lambda: from_local(torch.ones(2, 2), mesh, [Shard(5)]))
    other_mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("other",))
    b = from_local(torch.ones(sizes[rank], 2), other_mesh, [Shard(0)], sizes)
    out["different_meshes"] = _catch(lambda: a + b)
    c = from_local(torch.ones(8, 1), mesh, [Shard(1)], (1, 1))  # global (8, 2), dim 1 sharded
    out["different_dims"] = _catch(lambda: a * c)
    out["bad_global_shapes"] = _catch(lambda: a + torch.ones(3, 3))
    out["no_rule"] = _catch(lambda: torch.fft.fft(a, dim=0))  # over the sharded dim
    out["item_of_sharded"] = _catch(lambda: a.item())
    # binary op between the same dim with different sizes is redistributed, not refused
    d = from_local(torch.ones((4, 4)[rank], 2) * 2, mesh, [Shard(0)], (4, 4))
    s = a * d
    out["auto_redistribute_sizes"] = (s.sharding_sizes(), float(s.sum().item()))
    return out


def no_rule(rank, ws, sizes):
    """Ops without a rule of their own: local where exact (replicated inputs; along a free dim
    for ops that work along ``dim``), else NoShardingRuleError naming the op."""
    from meshshard.shardtensor import NoShardingRuleError, Partial, Replicate, Shard, from_local

    mesh = _mesh(ws)
    g = torch.Generator().manual_seed(3)
    full = torch.randn(sum(sizes), 4, generator=g, dtype=torch.float64)
    off = sum(sizes[:rank])
    a = from_local(full[off : off + sizes[rank]], mesh, [Shard(0)], sizes)
    rep = from_local(full, mesh, [Replicate()])
    part = from_local(full * (rank + 1) / sum(range(1, ws + 1)), mesh, [Partial()])
    out = {}
    for name, fn in (("sort over the sharded dim", lambda: torch.sort(a, dim=0)),
                     ("renorm (its dim is not the one it works along)",
                      lambda: torch.renorm(a, 2, 1, 1.0)),
                     ("random op on replicated copies", lambda: torch.rand_like(rep))):
        try:
            fn()
            out[name] = ("no error", "")
        except NoShardingRuleError as exc:
            out[name] = ("NoShardingRuleError", str(exc))  # or a subclass of it
    v, i = torch.sort(a, dim=1, descending=True)
    rv, ri = torch.sort(full, dim=1, descending=True)
    out["sort free dim"] = (v.full_tensor(), rv, v.placements == a.placements)
    out["sort free dim indices"] = (i.full_tensor(), ri, True)
    out["topk free dim"] = (torch.topk(a, 2, dim=1)[0].full_tensor(), torch.topk(full, 2, 1)[0],
                            True)
    out["cummax free dim"] = (torch.cummax(a, 1)[0].full_tensor(), torch.cummax(full, 1)[0], True)
    out["sort replicated"] = (torch.sort(rep, dim=0)[0].full_tensor(), torch.sort(full, 0)[0],
                              True)
    out["sort of a Partial (summed first)"] = (torch.sort(part, dim=0)[0].full_tensor(),
                                               torch.sort(full, 0)[0], True)
    r = torch.sort(a.redistribute([Replicate()]), dim=0)[0]
    out["after redistribute"] = (r.full_tensor(), torch.sort(full, 0)[0], True)
    return out


def error_text(rank, ws):
    try:
        return construction(rank, ws, (3, 5))
    except Exception:
        return traceback.format_exc()


def printing(rank, ws):
    from meshshard.shardtensor import Shard, from_local

    mesh = _mesh(ws)
    a = from_local(torch.ones((3, 5)[rank], 2), mesh, [Shard(0)], (3, 5))
    return repr(a), str(a), f"{a.sum():.1f}", len(a)


def sharding_shape_forms(rank, ws, sizes):
    """Every accepted form of ``sharding_shapes`` gives the same layout; malformed ones give a
    ValueError (never an IndexError or a hang: every rank raises before any collective)."""
    import torch

    from meshshard.shardtensor import Shard, from_local

    mesh = _mesh(ws)
    local = torch.randn(sizes[rank], 4)
    shapes = [torch.Size([s, 4]) for s in sizes]
    forms = {
        "flat sizes": list(sizes),
        "per mesh dim": [list(sizes)],
        "dict of sizes": {0: tuple(sizes)},
        "dict of shapes (PhysicsNeMo)": {0: tuple(shapes)},
        "list of shapes (PhysicsNeMo, 1-D mesh)": shapes,
        "list of tuples": [tuple(s) for s in shapes],
    }
    got = {name: from_local(local, mesh, [Shard(0)], f).sharding_sizes() for name, f in
           forms.items()}
    bad = {
        "too few shapes": shapes[:-1],
        "shape of the wrong rank": [torch.Size([s]) for s in sizes],
        "negative size": {0: tuple(-1 for _ in sizes)},
        "float sizes": [float(s) for s in sizes],
        "a string": "3,5",
        "mesh dim out of range": {3: tuple(sizes)},
    }
    errors = {}
    for name, f in bad.items():
        try:
            from_local(local, mesh, [Shard(0)], f, validate=False)
            errors[name] = None
        except Exception as e:  # the type is part of what is checked
            errors[name] = (type(e).__name__, str(e))
    return got, errors
