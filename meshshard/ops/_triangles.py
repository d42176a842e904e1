"""Local triangle kernels for the signed distance field (no communication).

- :func:`closest_points`: the closest point of each (query, triangle) pair and which feature of
  the triangle it lies on (face interior, one of the three vertices, one of the three edges),
  Ericson's region test ("Real-Time Collision Detection", 5.1.5), vectorised.
- :func:`nearest_triangles`: per query, the nearest of a set of triangles, exactly, with a
  spatial prune (kd-tree on centroids: a bound from the 8 nearest centroids' triangles, then
  every triangle whose centroid lies within bound + largest centroid-vertex radius, of which
  only those whose bounding box lies within the bound get the exact kernel).
- :func:`winding_number`: the generalised winding number by brute force (the single-process
  oracle of the sign; O(queries x triangles)).
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["FEATURE_EDGES", "closest_points", "face_geometry", "nearest_triangles",
           "winding_number"]

# feature codes: 0 face, 1..3 vertices a, b, c, 4..6 edges ab, bc, ca
FEATURE_EDGES = ((0, 1), (1, 2), (2, 0))

_CHUNK_PAIRS = 1 << 20


def _dot(u, v):
    return (u * v).sum(-1)


def _safe(x):
    return torch.where(x == 0, torch.ones_like(x), x)


def closest_points(p: torch.Tensor, tri: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Closest point on triangle ``tri[i]`` (3, 3) to ``p[i]`` (3,), and its feature code.

    Returns
    -------
    point : Tensor (n, 3)
    feature : Tensor (n,), int64: 0 face, 1-3 vertex a/b/c, 4-6 edge ab/bc/ca
    """
    a, b, c = tri[:, 0], tri[:, 1], tri[:, 2]
    ab, ac, ap = b - a, c - a, p - a
    d1, d2 = _dot(ab, ap), _dot(ac, ap)
    bp = p - b
    d3, d4 = _dot(ab, bp), _dot(ac, bp)
    cp = p - c
    d5, d6 = _dot(ab, cp), _dot(ac, cp)
    vc = d1 * d4 - d3 * d2
    vb = d5 * d2 - d1 * d6
    va = d3 * d6 - d5 * d4
    conds = [
        (d1 <= 0) & (d2 <= 0),
        (d3 >= 0) & (d4 <= d3),
        (vc <= 0) & (d1 >= 0) & (d3 <= 0),
        (d6 >= 0) & (d5 <= d6),
        (vb <= 0) & (d2 >= 0) & (d6 <= 0),
        (va <= 0) & ((d4 - d3) >= 0) & ((d5 - d6) >= 0),
    ]
    v_ab = (d1 / _safe(d1 - d3))[:, None]
    w_ac = (d2 / _safe(d2 - d6))[:, None]
    w_bc = ((d4 - d3) / _safe((d4 - d3) + (d5 - d6)))[:, None]
    den = _safe(va + vb + vc)
    v, w = (vb / den)[:, None], (vc / den)[:, None]
    cands = [a, b, a + v_ab * ab, c, a + w_ac * ac, b + w_bc * (c - b)]
    codes = [1, 2, 4, 3, 6, 5]
    point = a + ab * v + ac * w
    feat = torch.zeros(p.shape[0], dtype=torch.int64, device=p.device)
    taken = torch.zeros(p.shape[0], dtype=torch.bool, device=p.device)
    for cond, cand, code in zip(conds, cands, codes):
        sel = cond & ~taken
        point = torch.where(sel[:, None], cand, point)
        feat = torch.where(sel, code, feat)
        taken |= sel
    return point, feat


def face_geometry(tri: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unit face normals (t, 3), interior angles at the three corners (t, 3) and areas (t,)."""
    e1, e2 = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]
    cr = torch.linalg.cross(e1, e2)
    area2 = torch.linalg.vector_norm(cr, dim=-1)
    normal = cr / _safe(area2)[:, None]
    angles = []
    for i in range(3):
        u = tri[:, (i + 1) % 3] - tri[:, i]
        w = tri[:, (i + 2) % 3] - tri[:, i]
        angles.append(torch.atan2(torch.linalg.vector_norm(torch.linalg.cross(u, w), dim=-1),
                                  _dot(u, w)))
    return normal, torch.stack(angles, 1), area2 / 2


def winding_number(q: torch.Tensor, tri: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """Generalised winding number of every query w.r.t. all triangles (Van Oosterom-Strackee).

    ~±1 inside a closed surface, ~0 outside. Brute force (the oracle for small meshes).
    """
    out = torch.zeros(q.shape[0], dtype=q.dtype, device=q.device)
    for s in range(0, q.shape[0], chunk):
        A = tri[None, :, 0] - q[s : s + chunk, None]
        B = tri[None, :, 1] - q[s : s + chunk, None]
        Cv = tri[None, :, 2] - q[s : s + chunk, None]
        la, lb, lc = (torch.linalg.vector_norm(x, dim=-1) for x in (A, B, Cv))
        num = _dot(A, torch.linalg.cross(B, Cv))
        den = la * lb * lc + _dot(A, B) * lc + _dot(A, Cv) * lb + _dot(B, Cv) * la
        out[s : s + chunk] = (2 * torch.atan2(num, den)).sum(1) / (4 * math.pi)
    return out


def _pairs_best(q, tri, qi, ti, m):
    """For pairs (qi, ti): per query the (d2, triangle, point, feature) of the nearest."""
    point, feat = closest_points(q[qi], tri[ti])
    d2 = ((q[qi] - point) ** 2).sum(-1)
    # order by (query, d2, triangle): the first of each query wins (ties by lower index)
    o = torch.argsort(ti, stable=True)
    o = o[torch.argsort(d2[o], stable=True)]
    o = o[torch.argsort(qi[o], stable=True)]
    qs = qi[o]
    first = torch.ones_like(qs, dtype=torch.bool)
    first[1:] = qs[1:] != qs[:-1]
    w = o[first]
    return qi[w], d2[w], ti[w], point[w], feat[w]


def nearest_triangles(q: torch.Tensor, tri: torch.Tensor, ub2: torch.Tensor | None = None):
    """Exact nearest triangle of every query (ties by the lower triangle index).

    Parameters
    ----------
    q : Tensor (m, 3);  tri : Tensor (t, 3, 3), same dtype, ``t >= 1``
    ub2 : Tensor (m,), optional
        A known upper bound of each query's squared distance to the surface (from triangles
        elsewhere). Triangles farther than it are skipped; a query with none within it gets
        ``d2 = inf`` and triangle ``-1``.

    Returns
    -------
    d2 (m,), triangle (m,) int64, point (m, 3), feature (m,) int64 — all detached.
    """
    from scipy.spatial import cKDTree

    q, tri = q.detach(), tri.detach()
    m, t = q.shape[0], tri.shape[0]
    dev = q.device
    d2 = torch.full((m,), float("inf"), dtype=q.dtype, device=dev)
    tid = torch.full((m,), -1, dtype=torch.int64, device=dev)
    pt = torch.zeros((m, 3), dtype=q.dtype, device=dev)
    ft = torch.zeros((m,), dtype=torch.int64, device=dev)
    if m == 0:
        return d2, tid, pt, ft
    cen = tri.mean(1)
    rad = float(torch.linalg.vector_norm(tri - cen[:, None], dim=-1).max())
    tree = cKDTree(cen.cpu().double().numpy())
    qn = q.cpu().double().numpy()
    kk = min(8, t)
    _, near = tree.query(qn, k=kk)
    near = torch.as_tensor(np.asarray(near).reshape(m, kk), device=dev)
    qi = torch.arange(m, device=dev).repeat_interleave(kk)
    _, bd2, _, _, _ = _pairs_best(q, tri, qi, near.reshape(-1), m)
    if ub2 is not None:
        bd2 = torch.minimum(bd2, ub2.to(bd2.dtype))
    lo, hi = tri.min(1).values, tri.max(1).values
    bound = bd2.sqrt().cpu().double().numpy() * (1 + 1e-9) + rad * (1 + 1e-9) + 1e-300
    step = max(1, _CHUNK_PAIRS // max(1, 4 * kk))
    for s in range(0, m, step):
        hits = tree.query_ball_point(qn[s : s + step], bound[s : s + step])
        counts = np.fromiter((len(h) for h in hits), dtype=np.int64, count=len(hits))
        ti = torch.as_tensor(np.concatenate([np.asarray(h, dtype=np.int64) for h in hits]),
                             device=dev)
        qi = torch.arange(s, s + len(hits), device=dev).repeat_interleave(
            torch.as_tensor(counts, device=dev))
        # exact prune: a triangle's box distance is a lower bound of its distance, the best of
        # the 8 nearest centroids' triangles an upper bound; only the survivors get the kernel
        qq = q[qi]
        gap = torch.clamp(torch.maximum(lo[ti] - qq, qq - hi[ti]), min=0)
        keep = (gap * gap).sum(-1) <= bd2[qi] * (1 + 1e-9)
        qi, ti = qi[keep], ti[keep]
        if qi.numel() == 0:
            continue
        w, dd, tt, pp, ff = _pairs_best(q, tri, qi, ti, m)
        d2[w], tid[w], pt[w], ft[w] = dd, tt, pp, ff
    return d2, tid, pt, ft
