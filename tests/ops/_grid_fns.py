"""Rank function: point cloud <-> sharded grid vs one process (F.grid_sample and a dense
trilinear splat), forward and gradients."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

S = (8, 5, 4)


def _data(n_points):
    g = torch.Generator().manual_seed(0)
    grid = torch.randn(2, *S, generator=g, dtype=torch.float64)
    hi = torch.tensor(S, dtype=torch.float64) - 1
    pts = torch.rand(n_points, 3, generator=g, dtype=torch.float64) * (hi + 1.0) - 0.5
    pts = pts * 0.5 + 1.0  # physical = 0.5 * index + 1: exercises origin/spacing
    vals = torch.randn(n_points, 2, generator=g, dtype=torch.float64)
    return grid, pts, vals


def ref_gather(grid, pts):
    u = (pts - 1.0) / 0.5
    hi = torch.tensor(S, dtype=u.dtype) - 1
    norm = u / hi * 2 - 1
    g = norm.flip(-1)[None, None, None]  # (1, 1, 1, N, 3) as (x=W, y=H, z=D)
    out = F.grid_sample(grid[None], g, mode="bilinear", padding_mode="border",
                        align_corners=True)
    return out[0, :, 0, 0].T


def ref_scatter(pts, vals):
    u = torch.minimum(torch.clamp((pts - 1.0) / 0.5, min=0), torch.tensor(S) - 1.0)
    lo = torch.minimum(u.detach().floor().long(), torch.tensor(S) - 2)
    out = torch.zeros(*S, 2, dtype=vals.dtype)
    for b in itertools.product((0, 1), repeat=3):
        idx = lo + torch.tensor(b)
        w = torch.ones(len(pts), dtype=u.dtype)
        for j in range(3):
            f = u[:, j] - lo[:, j]
            w = w * (f if b[j] else 1 - f)
        out = out.index_put((idx[:, 0], idx[:, 1], idx[:, 2]), vals * w[:, None],
                            accumulate=True)
    return out.permute(3, 0, 1, 2)


def _grad(leaf):
    return torch.zeros_like(leaf) if leaf.grad is None else leaf.grad.clone()


def run(rank, world_size, grid_sizes, point_sizes, axis=0):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.ops.grid import grid_gather, grid_scatter
    from meshshard.shardtensor import Replicate, Shard, from_local

    mesh = init_device_mesh("cpu", (world_size,))
    grid, pts, vals = _data(sum(point_sizes))
    goff, poff = sum(grid_sizes[:rank]), sum(point_sizes[:rank])
    gl = grid.narrow(1 + axis, goff, grid_sizes[rank]).clone().requires_grad_()
    pl = pts[poff : poff + point_sizes[rank]].clone().requires_grad_()
    vl = vals[poff : poff + point_sizes[rank]].clone().requires_grad_()
    G = from_local(gl, mesh, [Shard(1 + axis)], grid_sizes)
    P = from_local(pl, mesh, [Shard(0)], point_sizes)
    V = from_local(vl, mesh, [Shard(0)], point_sizes)
    rg, rp, rv = (t.clone().requires_grad_() for t in (grid, pts, vals))
    R1 = torch.randn(len(pts), 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    R2 = torch.randn(2, *S, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    # forward
    got_g = grid_gather(G, P, origin=1.0, spacing=0.5)
    got_s = grid_scatter(P, V, S, grid_sizes, origin=1.0, spacing=0.5, axis=axis)
    want_g, want_s = ref_gather(rg, rp), ref_scatter(rp, rv)
    report = {"gather": (got_g.full_tensor().detach(), want_g.detach()),
              "scatter": (got_s.full_tensor().detach(), want_s.detach()),
              "scatter_layout": got_s.sharding_sizes()}
    ((got_g.full_tensor() * R1).sum() + (got_s.full_tensor() * R2).sum()).backward()
    ((want_g * R1).sum() + (want_s * R2).sum()).backward()
    sl_p = slice(poff, poff + point_sizes[rank])
    report["grid.grad"] = (_grad(gl), rg.grad.narrow(1 + axis, goff, grid_sizes[rank]))
    report["points.grad"] = (_grad(pl), rp.grad[sl_p])
    report["values.grad"] = (_grad(vl), rv.grad[sl_p])
    # a replicated grid works too (purely local reads, gradient summed over ranks)
    rep_grid = grid.clone().requires_grad_()
    Gr = from_local(rep_grid, mesh, [Replicate()])
    out = grid_gather(Gr, from_local(pl.detach(), mesh, [Shard(0)], point_sizes), origin=1.0,
                      spacing=0.5)
    (out.full_tensor() * R1).sum().backward()
    rg2 = grid.clone().requires_grad_()
    (ref_gather(rg2, pts) * R1).sum().backward()
    report["replicated"] = (out.full_tensor().detach(), ref_gather(grid, pts))
    report["replicated.grad"] = (rep_grid.grad, rg2.grad)
    return report
