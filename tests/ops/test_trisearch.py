"""The nearest-triangle tree search equals brute force (every pair through the exact kernel):
distances bit for bit, the same triangle (ties by the lower index), on soups built to stress
the bounds (curved, flat, slivers, degenerate, duplicated, far and on-surface queries)."""

from __future__ import annotations

import math

import pytest
import torch

from meshshard.ops._triangles import closest_points
from meshshard.ops._trisearch import TriangleTree, nearest_triangles
from tests.ops._sdf_fns import cube, torus


def _brute(q, tri):
    m, t = q.shape[0], tri.shape[0]
    qi = torch.arange(m).repeat_interleave(t)
    ti = torch.arange(t).repeat(m)
    pt, _ = closest_points(q[qi], tri[ti])
    d2 = ((q[qi] - pt) ** 2).sum(-1).reshape(m, t)
    best = d2.min(1).values
    # the lowest index among the exact minima
    tid = torch.where(d2 == best[:, None], torch.arange(t), t).min(1).values
    return best, tid


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _soups():
    g = _gen(0)
    flat = torch.rand(400, 3, 3, generator=g, dtype=torch.float64)
    flat[..., 2] = 0.0  # coplanar: the disc bound is at its tightest, ties in the plane
    slivers = torch.rand(300, 1, 3, generator=g, dtype=torch.float64).repeat(1, 3, 1)
    slivers[:, 1, 0] += 0.3  # long needles
    slivers[:, 2] += 1e-7 * torch.rand(300, 3, generator=g, dtype=torch.float64)
    degenerate = torch.rand(50, 3, 3, generator=g, dtype=torch.float64)
    degenerate[:20, 2] = degenerate[:20, 1]  # segments
    degenerate[20:30, 1:] = degenerate[20:30, :1]  # points
    mixed = torch.cat([torus(24, 12, bump=0.6, seed=2), 0.2 * torch.randn(200, 3, 3,
                                                                           generator=g,
                                                                           dtype=torch.float64)])
    dup = torch.cat([cube(), cube(), cube()[[3, 1]]])  # duplicated triangles: exact ties
    big = torch.cat([1e3 * cube(), 1e-3 * torus(8, 6)])  # scales six orders apart
    return {"torus": torus(40, 20), "flat": flat, "slivers": slivers, "degenerate": degenerate,
            "mixed": mixed, "dup": dup, "big": big, "one": torus(3, 3)[:1]}


def _queries(tri, seed):
    g = _gen(seed)
    lo, hi = tri.reshape(-1, 3).amin(0), tri.reshape(-1, 3).amax(0)
    span = (hi - lo).clamp(min=1e-3)
    box = lo - 0.5 * span + 2 * span * torch.rand(300, 3, generator=g, dtype=torch.float64)
    far = lo + 50 * span * torch.randn(20, 3, generator=g, dtype=torch.float64)
    verts = tri.reshape(-1, 3)[torch.randint(0, tri.shape[0] * 3, (40,), generator=g)]
    w = torch.rand(40, 3, generator=g, dtype=torch.float64)
    on = torch.einsum("sk,skd->sd", w / w.sum(1, keepdim=True),
                      tri[torch.randint(0, tri.shape[0], (40,), generator=g)])
    grid = torch.stack(torch.meshgrid(*[torch.linspace(float(lo[i] - 0.2 * span[i]),
                                                       float(hi[i] + 0.2 * span[i]), 7,
                                                       dtype=torch.float64)
                                        for i in range(3)], indexing="ij"), -1).reshape(-1, 3)
    return torch.cat([box, far, verts, on, grid])


@pytest.mark.parametrize("name", list(_soups()))
@pytest.mark.parametrize("fan", [2, 4, 7])
def test_tree_equals_brute_force(name, fan):
    tri = _soups()[name]
    q = _queries(tri, 3)
    want_d2, want_t = _brute(q, tri)
    tree = TriangleTree(tri, fan=fan)
    for block, switch in ((1, 0), (8, 2), (5, 99)):
        d2, tid, pt, ft = tree.nearest(q, block=block, switch=switch, chunk=7)
        assert torch.equal(d2, want_d2), f"{name} fan={fan} block={block}: distances"
        assert torch.equal(tid, want_t), f"{name} fan={fan} block={block}: triangles"
        p2, f2 = closest_points(q, tri[tid])
        assert torch.equal(pt, p2) and torch.equal(ft, f2)


def test_upper_bound_skips_farther_triangles_only():
    tri = torus(30, 14, bump=0.4, seed=4)
    q = _queries(tri, 5)
    want_d2, want_t = _brute(q, tri)
    ub2 = want_d2 * torch.where(torch.arange(q.shape[0]) % 2 == 0, 0.25, 1.0)
    d2, tid, _, _ = nearest_triangles(q, tri, ub2)
    odd = torch.arange(q.shape[0]) % 2 == 1
    assert torch.equal(d2[odd], want_d2[odd]) and torch.equal(tid[odd], want_t[odd])
    even = ~odd & (want_d2 > 0)
    # nothing within a quarter of the distance: none found, or one no nearer than the truth
    assert ((tid[even] == -1) | (d2[even] >= want_d2[even])).all()
    assert (tid[even] == -1).sum() > 0


def test_empty_queries_and_bad_triangles():
    tri = cube()
    d2, tid, pt, ft = TriangleTree(tri).nearest(torch.zeros(0, 3, dtype=torch.float64))
    assert d2.shape == (0,) and tid.shape == (0,) and pt.shape == (0, 3)
    for bad in (torch.zeros(0, 3, 3), torch.zeros(4, 3)):
        with pytest.raises(ValueError, match="triangles must be"):
            TriangleTree(bad.double())


def test_prunes_on_a_curved_surface():
    """Not a timing: the tree evaluates the exact kernel on a few triangles per query."""
    tri = torus(64, 32)
    q = _queries(tri, 6)
    tree = TriangleTree(tri)
    calls = []
    import meshshard.ops._trisearch as ts

    orig = ts.closest_points
    ts.closest_points = lambda a, b: (calls.append(a.shape[0]), orig(a, b))[1]
    try:
        tree.nearest(q)
    finally:
        ts.closest_points = orig
    per_query = sum(calls) / q.shape[0]
    assert per_query < 0.05 * tri.shape[0], per_query
    assert math.isfinite(per_query)
