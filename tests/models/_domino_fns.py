"""Rank function: DoMINO on shards (ShardedDominoOps) vs one process (LocalOps)."""

from __future__ import annotations

import torch

SHAPE = (6, 4, 5)  # (D, H, W)
ORIGIN = (0.0, 0.0, 0.0)
SPACING = (0.25, 0.25, 0.2)  # x spans W, y spans H, z spans D


def data(n_stl, n_pts, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    ext = torch.tensor(SPACING, dtype=torch.float64) * (torch.tensor(SHAPE[::-1]) - 1)
    stl = (torch.rand(n_stl, 3, generator=g, dtype=torch.float64) * ext).to(dtype)
    pts = (torch.rand(n_pts, 3, generator=g, dtype=torch.float64) * ext).to(dtype)
    sdf = torch.randn(*SHAPE, generator=g, dtype=torch.float64).to(dtype)
    feat = torch.randn(n_pts, 2, generator=g, dtype=torch.float64).to(dtype)
    target = torch.randn(n_pts, 3, generator=g, dtype=torch.float64).to(dtype)
    return stl, pts, sdf, feat, target


def model(dtype, ops=None, n_neighbors=7):
    from meshshard.models.domino import DoMINO

    torch.manual_seed(0)
    return DoMINO(SHAPE, ORIGIN, SPACING, radii=(0.3, 0.5), neighbors=(6, 12),
                  local_radii=(0.2, 0.3), local_neighbors=(4, 6), n_neighbors=n_neighbors,
                  point_features=2, out_channels=3, geo_channels=4, hidden=8, blocks=2,
                  ops=ops).to(dtype)


def reference(case, dtype):
    stl, pts, sdf, feat, target = data(sum(case["stl"]), sum(case["points"]), dtype)
    stl.requires_grad_()
    pts.requires_grad_()
    m = model(dtype, n_neighbors=case.get("k", 7))
    out = m(stl, sdf, pts, feat)
    loss = ((out - target) ** 2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    return out.detach(), loss.detach(), grads, {"stl": stl.grad, "points": pts.grad}


def sharded(rank, world_size, cases):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.ops.domino_ops import ShardedDominoOps, allreduce_grads

    meshes = {}
    res = []
    for case in cases:
        shape = tuple(case.get("mesh", (world_size,)))
        if shape not in meshes:
            meshes[shape] = init_device_mesh("cpu", shape)
        mesh = meshes[shape]
        dtype = case.get("dtype", torch.float64)
        stl, pts, sdf, feat, target = data(sum(case["stl"]), sum(case["points"]), dtype)
        so, po = sum(case["stl"][:rank]), sum(case["points"][:rank])
        sl = slice(so, so + case["stl"][rank])
        pl = slice(po, po + case["points"][rank])
        gs = case["grid"]
        if gs is None:
            sdf_l = sdf
        elif len(shape) == 1:
            sdf_l = sdf[sum(gs[:rank]) : sum(gs[:rank]) + gs[rank]]
        else:  # rank (a, b) of the 2-D mesh: D rows ds[a], H rows hs[b]
            a, b = mesh.get_coordinate()
            (ds, hs) = gs
            sdf_l = sdf[sum(ds[:a]) : sum(ds[: a + 1]), sum(hs[:b]) : sum(hs[: b + 1])]
        ops = ShardedDominoOps(mesh, gs, search=case.get("search", "forward"),
                               backend=case.get("backend", "auto"))
        lay = ops.layout(SHAPE, ORIGIN, SPACING)  # the same cut as a GridLayout (grid_sdf's)
        assert lay.local_shape(rank) == tuple(sdf_l.shape), (lay, sdf_l.shape)
        assert torch.equal(lay.local_nodes(rank, dtype),
                           ops.grid_nodes(SHAPE, ORIGIN, SPACING, dtype))
        m = model(dtype, ops, n_neighbors=case.get("k", 7))
        args = (stl[sl], sdf_l, pts[pl], feat[pl])
        if case.get("st"):
            res.append(_shardtensor_form(m, ops, mesh, case, args, target[pl], meshes))
            continue
        out = m(*args)
        total = ops.reduce_mean_count(out.numel())
        loss = ((out - target[pl]) ** 2).sum() / total
        loss.backward()
        allreduce_grads(m, ops.group)
        lt = loss.detach().clone()
        dist.all_reduce(lt)
        res.append({"out": out.detach(), "loss": lt,
                    "grads": {n: p.grad.clone() for n, p in m.named_parameters()}})
    return res


def _shardtensor_form(m, ops, mesh, case, args, target, meshes):
    """The same pieces as ShardTensors: the unmodified model runs on them, the loss is a
    ShardTensor mean, and a plain ``backward`` gives one process's gradients (no user call).
    The STL points and points require gradients (their backward collectives run beside the
    parameters' all-reduce). Also: a second backward of the same graph, ``autograd.grad`` of
    a second forward, and a third forward accumulated into ``.grad``, each summed once;
    ``allreduce_grads`` after this form raises."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.ops.domino_ops import allreduce_grads
    from meshshard.shardtensor import Replicate, Shard, from_local

    world = dist.get_world_size()
    if mesh.ndim == 1:
        pmesh = mesh
    else:  # points cut over all ranks: a 1-D mesh of them, rank order
        if (world,) not in meshes:
            meshes[(world,)] = init_device_mesh("cpu", (world,))
        pmesh = meshes[(world,)]
    gs = case["grid"]
    if gs is None:
        grid = from_local(args[1], mesh, [Replicate()] * mesh.ndim)
    elif mesh.ndim == 1:
        grid = from_local(args[1], mesh, [Shard(0)], [list(gs)])
    else:
        grid = from_local(args[1], mesh, [Shard(0), Shard(1)], [list(gs[0]), list(gs[1])])

    def pts(x, sizes=case["points"]):
        return from_local(x, pmesh, [Shard(0)], [list(sizes)])

    leaves = (args[0].clone().requires_grad_(), args[2].clone().requires_grad_())
    inputs = (pts(leaves[0], case["stl"]), grid, pts(leaves[1]), pts(args[3]))
    tgt = pts(target)
    out = m(*inputs)
    assert type(out) is type(inputs[2]), type(out)
    assert tuple(out.sharding_sizes(0)) == tuple(case["points"])
    loss = ((out - tgt) ** 2).mean()
    loss.backward(retain_graph=True)
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    inputs_grad = {"stl": leaves[0].grad.clone(), "points": leaves[1].grad.clone()}
    loss.backward()  # the same graph again: its partials are summed once more
    twice = {n: p.grad.clone() for n, p in m.named_parameters()}
    params = [p for _, p in m.named_parameters()]
    again = torch.autograd.grad(((m(*inputs) - tgt) ** 2).mean(), params)
    ((m(*inputs) - tgt) ** 2).mean().backward()  # accumulates into .grad
    thrice = {n: p.grad.clone() for n, p in m.named_parameters()}
    try:
        allreduce_grads(m, ops.group)
        refused = "no error"
    except ValueError as exc:
        refused = str(exc)
    with torch.no_grad():  # inference: no graph, no all-reduce, the same rows
        inferred = m(*inputs).to_local()
    local = out.to_local().detach()
    value = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
    return {"out": local, "loss": value.detach().reshape(()), "grads": grads, "twice": twice,
            "autograd_grad": dict(zip(grads, again)), "thrice": thrice, "refused": refused,
            "inputs_grad": inputs_grad, "no_grad": (inferred, local)}


def mismatched(rank, world_size):
    """The grid as a ShardTensor whose cut disagrees with the ops' (two one-line errors), and
    ShardTensor inputs mixed with a local tensor (a TypeError)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.ops.domino_ops import ShardedDominoOps
    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", (world_size,))
    stl, pts, sdf, feat, _ = data(20, 10, torch.float64)

    def st(x, n):  # rank 0 holds the first n rows
        rows = x[:n] if rank == 0 else x[n:]
        return from_local(rows, mesh, [Shard(0)], [[n, len(x) - n]])

    g = st(sdf, 3)
    msgs = []
    for sizes in ([1, 5], None):
        try:
            model(torch.float64, ShardedDominoOps(mesh, sizes))(st(stl, 7), g, st(pts, 4),
                                                                st(feat, 4))
        except ValueError as exc:
            msgs.append(str(exc))
    try:
        model(torch.float64, ShardedDominoOps(mesh, [3, 3]))(st(stl, 7), g, pts, st(feat, 4))
    except TypeError as exc:
        msgs.append(str(exc))
    return msgs


def uncovered(rank, world_size):
    """A sampled point outside the grid on rank 1 only: every rank raises."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.ops.domino_ops import ShardedDominoOps

    mesh = init_device_mesh("cpu", (world_size,))
    stl, pts, sdf, feat, _ = data(20, 10, torch.float64)
    pts = pts.clone()
    if rank == 1:
        pts[0, 0] = 50.0
    try:
        model(torch.float64, ShardedDominoOps(mesh, [3, 3]))(stl, sdf[3 * rank : 3 * rank + 3],
                                                             pts, feat)
    except ValueError as exc:
        return str(exc)
    return "no error"
