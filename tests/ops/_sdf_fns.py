"""Closed (and open) triangle soups for the SDF tests, the single-process oracle, and the rank
function that runs every case in one spawn."""

from __future__ import annotations

import math

import torch

from meshshard.ops._triangles import closest_points, winding_number


def torus(nu=16, nv=10, R=1.0, r=0.4, bump=0.0, seed=0) -> torch.Tensor:
    """A closed, outward-oriented triangulated torus as a soup (t, 3, 3), float64."""
    g = torch.Generator().manual_seed(seed)
    u = torch.arange(nu, dtype=torch.float64) * 2 * math.pi / nu
    v = torch.arange(nv, dtype=torch.float64) * 2 * math.pi / nv
    U, V = torch.meshgrid(u, v, indexing="ij")
    rr = r * (1 + bump * (torch.rand(nu, nv, generator=g, dtype=torch.float64) - 0.5))
    P = torch.stack([(R + rr * torch.cos(V)) * torch.cos(U), (R + rr * torch.cos(V)) * torch.sin(U),
                     rr * torch.sin(V)], -1)
    tris = []
    for i in range(nu):
        for j in range(nv):
            a, b = P[i, j], P[(i + 1) % nu, j]
            c, d = P[(i + 1) % nu, (j + 1) % nv], P[i, (j + 1) % nv]
            tris += [torch.stack([a, b, c]), torch.stack([a, c, d])]
    return torch.stack(tris)


def cube(h=0.5) -> torch.Tensor:
    """The unit cube [-h, h]^3 as 12 outward triangles (many exact distance ties)."""
    c = torch.tensor([[x, y, z] for x in (-h, h) for y in (-h, h) for z in (-h, h)],
                     dtype=torch.float64)
    quads = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]
    tris = []
    for a, b, cc, d in quads:
        tris += [c[[a, b, cc]], c[[a, cc, d]]]
    t = torch.stack(tris)
    # orient outward: the normal must point away from the centre
    n = torch.linalg.cross(t[:, 1] - t[:, 0], t[:, 2] - t[:, 0])
    flip = (n * t.mean(1)).sum(-1) < 0
    t[flip] = t[flip][:, [0, 2, 1]]
    return t


def queries(n, lo=-1.6, hi=1.6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return lo + (hi - lo) * torch.rand(n, 3, generator=g, dtype=torch.float64)


def reference(tri, q, signed=True):
    """Brute force over all pairs; sign from the generalised winding number (independent)."""
    m, t = q.shape[0], tri.shape[0]
    qi = torch.arange(m).repeat_interleave(t)
    ti = torch.arange(t).repeat(m)
    pt, _ = closest_points(q[qi], tri[ti])
    d = torch.linalg.vector_norm(q[qi] - pt, dim=-1).reshape(m, t).min(1).values
    if not signed:
        return d
    inside = winding_number(q, tri).abs() > 0.5
    return torch.where(inside, -d, d)


def sdf_cases(rank, world_size, cases):
    import warnings

    from meshshard.ops.gridpoint import GridLayout
    from meshshard.ops.sdf import ShardedSurface, grid_sdf, signed_distance

    out = []
    for case in cases:
        tri = {"torus": lambda: torus(), "bumpy": lambda: torus(20, 12, bump=0.5, seed=3),
               "cube": cube}[case["mesh"]]()
        if case.get("open"):
            tri = tri[case["open"]:]
        perm = torch.randperm(tri.shape[0], generator=torch.Generator().manual_seed(5))
        if case.get("shuffle", True):
            tri = tri[perm]
        tsz = case["tri"]
        tsz = [*tsz[:-1], tri.shape[0] - sum(tsz[:-1])]
        qsz = case["queries"]
        q = queries(sum(qsz), seed=case.get("seed", 1))
        toff, qoff = sum(tsz[:rank]), sum(qsz[:rank])
        tl = tri[toff : toff + tsz[rank]]
        ql = q[qoff : qoff + qsz[rank]].clone().requires_grad_()
        rep = {}
        if case.get("on_open") == "raise":
            try:
                ShardedSurface(tl, on_open="raise")
                rep["raised"] = ""
            except ValueError as e:
                rep["raised"] = str(e)
            out.append(rep)
            continue
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            surf = ShardedSurface(tl, nboxes=case.get("nboxes", 8))
        rep["warnings"] = [str(x.message) for x in w]
        rep["closed"] = surf.closed
        d = surf.signed_distance(ql)
        closed = surf.closed
        want = reference(tri, q, signed=closed)[qoff : qoff + qsz[rank]]
        rep["sdf"] = (d.detach(), want)
        d.sum().backward() if d.numel() else None
        rq = q[qoff : qoff + qsz[rank]].clone().requires_grad_()
        reference(tri, rq, signed=closed).sum().backward()
        rep["grad"] = (torch.zeros_like(ql) if ql.grad is None else ql.grad, rq.grad)
        if case.get("grid"):
            lay = GridLayout((5, 3, 4), (-1.4, -1.3, -0.8), (0.7, 1.1, 0.35), sizes=case["grid"],
                             axis=case.get("grid_axis", 0))
            got = grid_sdf(surf, lay, dtype=torch.float64)
            nodes = lay.local_nodes(rank, torch.float64)
            rep["grid"] = (got.reshape(-1), reference(tri, nodes, signed=closed))
        rep["functional"] = (signed_distance(tl, ql.detach()), want)
        out.append(rep)
    return out


def nonfinite(rank, world_size):
    """NaN in one rank's triangles, then in one rank's queries: every rank raises."""
    from meshshard.ops.sdf import ShardedSurface

    msgs = []
    tri = torus()[rank::world_size].clone()
    bad = tri.clone()
    if rank == 0:
        bad[2, 1, 0] = float("nan")
    try:
        ShardedSurface(bad)
    except ValueError as e:
        msgs.append(str(e))
    surf = ShardedSurface(tri)
    q = queries(5)
    if rank == 1:
        q[3, 2] = float("inf")
    try:
        surf.signed_distance(q)
    except ValueError as e:
        msgs.append(str(e))
    return msgs
