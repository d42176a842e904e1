"""Local triangle kernels for the signed distance field (no communication).

- :func:`closest_points`: the closest point of each (query, triangle) pair and which feature of
  the triangle it lies on (face interior, one of the three vertices, one of the three edges),
  Ericson's region test ("Real-Time Collision Detection", 5.1.5), vectorised.
- :func:`face_geometry`: unit normals, corner angles and areas.
- :func:`winding_number`: the generalised winding number by brute force (the single-process
  oracle of the sign; O(queries x triangles)).
"""

from __future__ import annotations

import math

import torch

__all__ = ["FEATURE_EDGES", "closest_points", "face_geometry", "winding_number"]

# feature codes: 0 face, 1..3 vertices a, b, c, 4..6 edges ab, bc, ca
FEATURE_EDGES = ((0, 1), (1, 2), (2, 0))


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
