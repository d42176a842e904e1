"""Rank functions: grid<->point ball query / kNN and sharded grid_sample against one process
(brute force float64 and ``F.grid_sample``), forward and gradients. One spawn runs all cases."""

from __future__ import annotations

import torch
import torch.nn.functional as tF

SHAPE = (5, 4, 3)  # (D, H, W)
ORIGIN = (0.1, -0.2, 0.3)  # (x, y, z)
SPACING = (0.25, 0.3, 0.2)


def _points(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    lo = torch.tensor(ORIGIN, dtype=torch.float64)
    ext = torch.tensor(SPACING, dtype=torch.float64) * (torch.tensor(SHAPE[::-1]) - 1)
    return lo - 0.1 + torch.rand(n, 3, generator=g, dtype=torch.float64) * (ext + 0.2)


def _weights(shape, seed):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def ref_radius(x, y, r):
    """Brute force: rows of y, neighbours in x within r, by (distance, index); padded."""
    d = torch.linalg.vector_norm(y[:, None] - x[None], dim=-1)
    within = d.detach() <= r
    w = int(within.sum(1).max()) if len(y) else 0
    idx = torch.full((len(y), w), -1, dtype=torch.int64)
    dd = torch.full((len(y), w), float("inf"), dtype=x.dtype)
    for i in range(len(y)):
        j = torch.nonzero(within[i]).squeeze(1)
        o = torch.argsort(d[i, j].detach(), stable=True)
        j = j[o]
        idx[i, : len(j)] = j
        dd[i, : len(j)] = d[i, j]
    return dd, idx


def ref_knn(x, y, k):
    d = torch.linalg.vector_norm(y[:, None] - x[None], dim=-1)
    o = torch.argsort(d.detach(), dim=1, stable=True)[:, :k]
    return d.gather(1, o), o


def _masked_sum(d, w):
    return torch.where(torch.isfinite(d), d, 0).mul(w).sum()


def gridpoint_cases(rank, world_size, cases):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.ops.gridpoint import GridLayout, grid_knn, grid_radius
    from meshshard.shardtensor import Replicate, Shard, from_local

    meshes: dict = {}
    out = []
    for case in cases:
        # a 2-D mesh: the points (and the grid's cut) on mesh dim 0, Replicate on dim 1
        shape = tuple(case.get("mesh", (world_size,)))
        if shape not in meshes:
            meshes[shape] = init_device_mesh("cpu", shape)
        mesh = meshes[shape]
        me = mesh.get_coordinate()[0]
        place = [Shard(0)] + [Replicate()] * (len(shape) - 1)
        psz, gsz, axis = case["points"], case["grid"], case.get("axis", 0)
        lay = GridLayout(SHAPE, ORIGIN, SPACING, sizes=gsz, axis=axis)
        pts = _points(sum(psz), case.get("seed", 0))
        off = sum(psz[:me])
        pl = pts[off : off + psz[me]].clone().requires_grad_()
        P = from_local(pl, mesh, place, [psz] + [None] * (len(shape) - 1))
        full_lay = GridLayout(SHAPE, ORIGIN, SPACING)
        nodes = full_lay.local_nodes(0, torch.float64)
        rp = pts.clone().requires_grad_()
        direction, op = case["direction"], case["op"]
        if op == "radius":
            d, i = grid_radius(P, case["r"], lay, direction=direction)
        else:
            d, i = grid_knn(P, case["k"], lay, direction=direction)
        if direction == "grid_to_points":
            want = ref_radius(rp, nodes, case["r"]) if op == "radius" else ref_knn(rp, nodes,
                                                                                  case["k"])
            # this rank's rows are its slab's nodes, in C order of the slab
            mine = full_lay.flat(lay.local_index(me)) if gsz is not None else None
        else:
            want = ref_radius(nodes, rp, case["r"]) if op == "radius" else ref_knn(nodes, rp,
                                                                                  case["k"])
            mine = torch.arange(off, off + psz[me])
        wd, wi = want
        if mine is not None:
            wd, wi = wd[mine], wi[mine]
        W = _weights(wd.shape, 7)
        _masked_sum(d.to_local(), W).backward()
        _masked_sum(wd, W).backward()
        # gradients: this rank's loss part only; sum the reference over ranks via all ranks
        gpl = torch.zeros_like(pl) if pl.grad is None else pl.grad
        rgrad = rp.grad.clone()
        gfull = torch.zeros_like(pts)
        gfull[off : off + psz[me]] = gpl
        torch.distributed.all_reduce(gfull)
        torch.distributed.all_reduce(rgrad)
        out.append({"index": (i.to_local(), wi), "dist": (d.to_local().detach(), wd.detach()),
                    "grad": (gfull, rgrad), "sizes": i.sharding_sizes() if gsz else None})
    return out


def _sample_ref(grid, coords, align, pad):
    c = coords[:, None, None]
    o = tF.grid_sample(grid, c, mode="bilinear", padding_mode=pad, align_corners=align)
    return o.reshape(grid.shape[0], grid.shape[1], -1).transpose(1, 2)


def grid_sample_cases(rank, world_size, mesh_shape, cases):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.ops.gridsample import grid_sample
    from meshshard.shardtensor import Replicate, Shard, from_local

    mesh = init_device_mesh("cpu", tuple(mesh_shape))
    coord = [mesh.get_local_rank(m) for m in range(mesh.ndim)]
    out = []
    for case in cases:
        B, C = 2, 3
        g = torch.Generator().manual_seed(case.get("seed", 1))
        grid = torch.randn(B, C, *SHAPE, generator=g, dtype=torch.float64)
        n = sum(case["points"])
        coords = torch.rand(B, n, 3, generator=g, dtype=torch.float64) * 2.4 - 1.2
        gl, cl = grid, coords
        gpl, cpl, gshapes, cshapes = [], [], {}, {}
        for m in range(mesh.ndim):
            gspec = case["grid"][m]  # None or (spatial axis, sizes)
            if gspec is None:
                gpl.append(Replicate())
            else:
                a, sz = gspec
                gpl.append(Shard(2 + a))
                gshapes[m] = list(sz)
                gl = gl.narrow(2 + a, sum(sz[: coord[m]]), sz[coord[m]])
            if case["route"] == m:
                sz = case["points"]
                cpl.append(Shard(1))
                cshapes[m] = list(sz)
                cl = cl.narrow(1, sum(sz[: coord[m]]), sz[coord[m]])
            else:
                cpl.append(Replicate())
        gl = gl.clone().requires_grad_()
        cl = cl.clone().requires_grad_()
        G = from_local(gl, mesh, gpl, gshapes or None)
        Cc = from_local(cl, mesh, cpl, cshapes or None)
        rg, rc = grid.clone().requires_grad_(), coords.clone().requires_grad_()
        R = _weights((B, n, C), 11)
        rep = {}
        for align in (True, False):
            for pad in ("zeros", "border"):
                for t in (gl, cl, rg, rc):
                    t.grad = None
                got = grid_sample(G, Cc, align_corners=align, padding_mode=pad)
                want = _sample_ref(rg, rc, align, pad)
                (got.full_tensor() * R).sum().backward()
                (want * R).sum().backward()
                # the reference gradients of this rank's pieces
                wg, wc = rg.grad, rc.grad
                for m in range(mesh.ndim):
                    if case["grid"][m] is not None:
                        a, sz = case["grid"][m]
                        wg = wg.narrow(2 + a, sum(sz[: coord[m]]), sz[coord[m]])
                    if case["route"] == m:
                        sz = case["points"]
                        wc = wc.narrow(1, sum(sz[: coord[m]]), sz[coord[m]])
                key = f"align={align},pad={pad}"
                rep[key + ":out"] = (got.full_tensor().detach(), want.detach())
                rep[key + ":grid.grad"] = (gl.grad.clone(), wg.clone())
                rep[key + ":coords.grad"] = (cl.grad.clone(), wc.clone())
        out.append(rep)
    return out


def radius_zero(rank, world_size):
    from meshshard.ops.gridpoint import GridLayout, grid_radius

    lay = GridLayout(SHAPE, ORIGIN, SPACING, sizes=[2, 3])
    try:
        grid_radius(torch.zeros(3, 3), 0.0, lay)
    except ValueError as e:
        return str(e)
    return "no error"
