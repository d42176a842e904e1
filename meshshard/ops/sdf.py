"""A sharded signed distance field: distances from query points (or grid nodes) to a
triangulated closed surface whose triangles are spread over ranks; no rank holds them all.

Algorithm (all collectives over one process group):

1. **Setup** (:class:`ShardedSurface`, once per surface). Triangles are a soup ``(t, 3, 3)``
   per rank, as in an STL; shared vertices and edges are recognised by their exact
   coordinates. The angle-weighted pseudo-normals of every vertex and edge (Baerentzen and
   Aanaes 2005) are summed over ranks by a keyed reduction: each vertex / edge goes to the rank
   its coordinate hash names, is summed there and comes back (two uneven all-to-alls). The same
   reduction counts each edge's triangles and directions, so an edge used by one triangle (open),
   by three or more, or twice in the same direction (inconsistent orientation) is found. One
   all-reduce of the signed volume tells whether the triangles face outwards. One all-gather
   shares every rank's triangle boxes (``nboxes`` runs of its rows).
2. **Query**, in two rounds. First every query goes to the rank of its nearest box, which
   answers with its exact nearest triangle (a branch and bound over a tree of disc-bounded
   triangle nodes, :mod:`._trisearch`, built once per surface): the squared distance, the
   closest point, the sign of ``(q - c) . n`` with ``n`` the pseudo-normal of the feature
   ``c`` lies on, and the triangle's global index. That distance bounds the answer: the query
   then goes only to the other ranks with a box within it, which search with it as their
   bound (a rank whose triangles all lie beyond it prunes at its tree's root). The querier
   keeps the nearest (ties by the lower triangle index).

The sign is exact for a closed, consistently oriented, non-self-intersecting surface: negative
inside, positive outside, 0 on the surface. With open edges (or non-manifold / inconsistently
oriented ones) ``on_open="warn"`` (the default) warns once and returns the **unsigned**
distance; ``on_open="raise"`` raises ``ValueError``. The result is differentiable with respect
to the queries (``sign * |q - c|``, ``c`` held fixed), not the triangles.
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.distributed as dist

from meshshard.comm.check import check_collective
from meshshard.comm.rows import all_gather_rows, all_to_all, collective_flag, exchange_counts
from meshshard.ops._regions import box_mindist2
from meshshard.ops._triangles import FEATURE_EDGES, face_geometry
from meshshard.ops._trisearch import TriangleTree
from meshshard.ops.api import _is_st, _layout, _wrap

__all__ = ["ShardedSurface", "grid_sdf", "signed_distance"]

log = logging.getLogger(__name__)

_PRIMES = (0x9E3779B97F4A7C15 - (1 << 64), 0xC2B2AE3D27D4EB4F - (1 << 64), 0x165667B19E3779F9,
           0x27D4EB2F165667C5, 0x7FEB352D, 0x846CA68B)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """Exact int64 keys of float64 coordinates (-0.0 and 0.0 alike)."""
    return (x.detach().double() + 0.0).contiguous().view(torch.int64)


def _hash(keys: torch.Tensor) -> torch.Tensor:
    h = torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
    for j in range(keys.shape[1]):
        h = (h ^ (keys[:, j] * _PRIMES[j % len(_PRIMES)])) * 31 + (h >> 29)
    return h


def _owner(keys: torch.Tensor, P: int) -> torch.Tensor:
    return _hash(keys).remainder(P)


def _groups(keys: torch.Tensor) -> torch.Tensor:
    """Group index of every row of the int64 keys (n, c): equal rows, and only they, share one.

    One sort by a 64-bit hash, then a check that every run of equal hashes holds equal rows
    (``torch.unique(dim=0)`` is 10x slower); a hash collision falls back to it."""
    h = _hash(keys)
    o = torch.argsort(h)
    hs, ks = h[o], keys[o]
    new = torch.ones(keys.shape[0], dtype=torch.bool, device=keys.device)
    new[1:] = hs[1:] != hs[:-1]
    if bool((~new[1:] & (ks[1:] != ks[:-1]).any(1)).any()):
        return torch.unique(keys, dim=0, return_inverse=True)[1]
    inv = torch.empty_like(h)
    inv[o] = torch.cumsum(new, 0) - 1
    return inv


def _keyed_sum(keys: torch.Tensor, vals: torch.Tensor, group) -> torch.Tensor:
    """Sum ``vals`` over all rows of all ranks with equal ``keys``; every row gets its sum.

    Collective (two count exchanges, four all-to-alls)."""
    P = dist.get_world_size(group)
    owner = _owner(keys, P)
    o = torch.argsort(owner, stable=True)
    send = torch.bincount(owner, minlength=P).tolist()
    recv = exchange_counts(send, group, keys.device)
    rk = all_to_all(keys[o], send, recv, group)
    rv = all_to_all(vals[o], send, recv, group)
    if rk.shape[0]:
        inv = _groups(rk)
        sums = rv.new_zeros((int(inv.max()) + 1, rv.shape[1])).index_add(0, inv, rv)
        back_vals = sums[inv]
    else:
        back_vals = rv
    back = all_to_all(back_vals, recv, send, group)
    out = torch.empty_like(vals)
    out[o] = back
    return out


def _boxes(tri: torch.Tensor, nboxes: int) -> torch.Tensor:
    """``[lo, hi, count]`` (nboxes, 7) float64 boxes around runs of triangles."""
    out = torch.empty((nboxes, 7), dtype=torch.float64, device=tri.device)
    out[:, :3], out[:, 3:6], out[:, 6] = float("inf"), float("-inf"), 0
    t = tri.shape[0]
    b = [(i * t) // nboxes for i in range(nboxes + 1)]
    for i in range(nboxes):
        if b[i + 1] > b[i]:
            seg = tri[b[i] : b[i + 1]].detach().double().reshape(-1, 3)
            out[i, :3], out[i, 3:6], out[i, 6] = seg.amin(0), seg.amax(0), b[i + 1] - b[i]
    return out


def _world(group):
    return dist.get_world_size(group), dist.get_rank(group)


class ShardedSurface:
    """A closed triangulated surface whose triangles are sharded over the ranks of ``group``.

    Collective: every rank of ``group`` must construct it (and call every method) together.

    Parameters
    ----------
    triangles : Tensor of shape (t_local, 3, 3)
        This rank's triangles (corner coordinates; may be empty). A ShardTensor sharded along
        dim 0 is accepted too (its group is used).
    group : ProcessGroup, optional
    nboxes : int
        Boxes per rank describing its triangles for the query prune.
    on_open : {"warn", "raise"}
        What to do when the surface is not closed and consistently oriented: warn once and give
        unsigned distances, or raise ``ValueError``.

    Attributes
    ----------
    closed : bool
        Whether the sign is available. ``open_edges`` counts the offending edges (all ranks).
    """

    def __init__(self, triangles, *, group: dist.ProcessGroup | None = None, nboxes: int = 32,
                 on_open: str = "warn"):
        if on_open not in ("warn", "raise"):
            msg = f"ShardedSurface: on_open={on_open!r} must be 'warn' or 'raise'"
            raise ValueError(msg)
        if _is_st(triangles):
            triangles, _, _, _, _, group = _layout(triangles, "triangles", "ShardedSurface")
        if triangles.ndim != 3 or tuple(triangles.shape[1:]) != (3, 3):
            msg = f"ShardedSurface: triangles must be (t, 3, 3), got {tuple(triangles.shape)}"
            raise ValueError(msg)
        self.group = group
        P, rank = _world(group)
        tri = triangles.detach().double()
        bad = int((~torch.isfinite(tri)).flatten(1).any(1).sum()) if tri.ndim == 3 else 0
        collective_flag(f"ShardedSurface: {bad} triangles have NaN or inf corners" if bad
                        else None, group=group, device=tri.device, op="ShardedSurface")
        self.dtype = triangles.dtype
        counts = all_gather_rows(torch.tensor([tri.shape[0]], dtype=torch.float64,
                                              device=tri.device), group)
        self.sizes = [int(c) for c in counts.reshape(-1).tolist()]
        if sum(self.sizes) == 0:
            msg = "ShardedSurface: no rank holds a triangle"
            raise ValueError(msg)
        self.offset = sum(self.sizes[:rank])
        self.tri = tri
        normal, angle, _ = face_geometry(tri)
        t = tri.shape[0]
        # vertices: angle-weighted normals; edges: unit normals, count, direction balance
        vkeys = _bits(tri.reshape(-1, 3))
        vvals = (normal[:, None] * angle[..., None]).reshape(-1, 3)
        ekeys, evals = [], []
        for i, j in FEATURE_EDGES:
            ki, kj = _bits(tri[:, i]), _bits(tri[:, j])
            fwd = _less(ki, kj)
            lo = torch.where(fwd[:, None], ki, kj)
            hi = torch.where(fwd[:, None], kj, ki)
            ekeys.append(torch.cat([lo, hi], 1))
            evals.append(torch.cat([normal, torch.ones(t, 1, dtype=tri.dtype, device=tri.device),
                                    torch.where(fwd, 1.0, -1.0)[:, None].to(tri.dtype)], 1))
        ekeys, evals = torch.cat(ekeys), torch.cat(evals)
        vsum = _keyed_sum(vkeys, vvals, group).reshape(t, 3, 3)
        esum = _keyed_sum(ekeys, evals, group).reshape(3, t, 5).transpose(0, 1)
        zero = tri.new_zeros(())
        bad = ((esum[..., 3] != 2) | (esum[..., 4] != 0)).sum() if t else zero
        vol = (tri[:, 0] * torch.linalg.cross(tri[:, 1], tri[:, 2])).sum() / 6 if t else zero
        flags = torch.stack([bad.to(torch.float64), vol.to(torch.float64)])
        check_collective("all_reduce", group, flags, detail="sdf: open edges, volume")
        dist.all_reduce(flags, group=group)
        self.open_edges = int(flags[0])
        self.closed = self.open_edges == 0
        self.orientation = 1.0 if float(flags[1]) >= 0 else -1.0
        if not self.closed:
            msg = (f"ShardedSurface: the surface is not closed and consistently oriented "
                   f"({self.open_edges} triangle sides on open, non-manifold or flipped edges)")
            if on_open == "raise":
                raise ValueError(msg + "; the sign needs a watertight surface (repair the STL)")
            if rank == 0:
                warnings.warn(msg + "; returning UNSIGNED distances", stacklevel=2)
        # pseudo-normals per triangle feature: [face, vertex a, b, c, edge ab, bc, ca]
        self.pn = torch.cat([normal[:, None], vsum, esum[..., :3]], 1) * self.orientation
        self.boxes = all_gather_rows(_boxes(tri, nboxes), group)  # (P, nboxes, 7)
        self.tree = TriangleTree(tri) if t else None

    def _answer(self, q: torch.Tensor, ub2: torch.Tensor) -> torch.Tensor:
        """Rows ``[d2, cx, cy, cz, sign, global triangle]`` of this rank's nearest triangle."""
        out = torch.full((q.shape[0], 6), float("inf"), dtype=torch.float64, device=q.device)
        if q.shape[0] == 0 or self.tri.shape[0] == 0:
            return out
        d2, tid, pt, ft = self.tree.nearest(q, ub2)
        n = self.pn[tid.clamp(min=0), ft]
        s = torch.sign(((q - pt) * n).sum(-1))
        return torch.cat([d2[:, None], pt, s[:, None], (tid + self.offset)[:, None].double()], 1)

    def _ask(self, q: torch.Tensor, qi: torch.Tensor, dest: torch.Tensor,
             ub2: torch.Tensor) -> torch.Tensor:
        """Rows ``q[qi]`` to ranks ``dest`` with their bounds ``ub2``; the answers
        (:meth:`_answer`), aligned with ``qi``. Collective."""
        P, _ = _world(self.group)
        o = torch.argsort(dest, stable=True)
        send = torch.bincount(dest, minlength=P).tolist()
        recv = exchange_counts(send, self.group, q.device)
        rq = all_to_all(torch.cat([q[qi[o]], ub2[o, None]], 1), send, recv, self.group)
        back = all_to_all(self._answer(rq[:, :3], rq[:, 3]), recv, send, self.group)
        out = torch.empty_like(back)
        out[o] = back
        return out

    def signed_distance(self, queries: torch.Tensor, *, signed: bool = True) -> torch.Tensor:
        """Signed (or unsigned) distance of this rank's ``queries`` (m, 3) to the surface.

        Collective over the surface's group. Differentiable w.r.t. ``queries``; returns (m,)
        in the queries' dtype. Unsigned when ``signed=False`` or the surface is not closed.
        """
        if queries.ndim != 2 or queries.shape[1] != 3:
            msg = f"signed_distance: queries must be (m, 3), got {tuple(queries.shape)}"
            raise ValueError(msg)
        P, _ = _world(self.group)
        q = queries.detach().double()
        bad = int((~torch.isfinite(q)).any(1).sum())
        collective_flag(f"signed_distance: {bad} queries have NaN or inf coordinates" if bad
                        else None, group=self.group, device=q.device, op="signed_distance")
        m, nb = q.shape[0], self.boxes.shape[1]
        inf = torch.full((m,), float("inf"), dtype=torch.float64, device=q.device)
        # round 1: every query to the rank of its nearest box, for an exact upper bound
        if m:
            mind = box_mindist2(q, self.boxes.reshape(-1, 7)).reshape(m, P, nb).amin(2)
            first = mind.argmin(1)
        else:
            mind = torch.zeros((0, P), dtype=torch.float64, device=q.device)
            first = torch.zeros(0, dtype=torch.int64, device=q.device)
        every = torch.arange(m, device=q.device)
        one = self._ask(q, every, first, inf)
        # round 2: only to the other ranks with a box within that bound, which then search
        # with it (a far rank's tree prunes at its root)
        near = mind <= one[:, 0:1] * (1 + 1e-9)
        near[every, first] = False
        dest, qi = torch.nonzero(near.t(), as_tuple=True)
        two = self._ask(q, qi, dest, one[qi, 0])
        back, qi = torch.cat([one, two]), torch.cat([every, qi])
        # keep per query the smallest d2, ties by lower triangle index
        o = torch.argsort(back[:, 5], stable=True)
        o = o[torch.argsort(back[o, 0], stable=True)]
        o = o[torch.argsort(qi[o], stable=True)]
        qs = qi[o]
        first = torch.ones_like(qs, dtype=torch.bool)
        first[1:] = qs[1:] != qs[:-1]
        best = torch.empty((m, 6), dtype=torch.float64, device=q.device)
        best[qs[first]] = back[o[first]]
        point = best[:, 1:4].to(queries.dtype)
        d = torch.linalg.vector_norm(queries - point, dim=-1)
        if signed and self.closed:
            d = d * torch.where(best[:, 4] < 0, -1.0, 1.0).to(d.dtype)
        return d


def _less(ki: torch.Tensor, kj: torch.Tensor) -> torch.Tensor:
    """Row-wise lexicographic ``ki < kj`` of (n, 3) int64 keys."""
    out = torch.zeros(ki.shape[0], dtype=torch.bool, device=ki.device)
    decided = torch.zeros_like(out)
    for c in range(ki.shape[1]):
        lt, gt = ki[:, c] < kj[:, c], ki[:, c] > kj[:, c]
        out |= ~decided & lt
        decided |= lt | gt
    return out


def signed_distance(triangles, queries, *, group: dist.ProcessGroup | None = None,
                    signed: bool = True, on_open: str = "warn", nboxes: int = 32):
    """Signed distance of ``queries`` to the sharded closed surface ``triangles``.

    Collective. ``triangles``: (t_local, 3, 3) per rank, ``queries``: (m_local, 3) per rank, or
    ShardTensors sharded along dim 0 on one mesh (the result is then sharded like ``queries``).
    Negative inside. See :class:`ShardedSurface` (build it once to query it many times).
    """
    surf = ShardedSurface(triangles, group=group, nboxes=nboxes, on_open=on_open)
    if _is_st(queries):
        ql, mesh, pl, _, sizes, _ = _layout(queries, "queries", "signed_distance")
        return _wrap(surf.signed_distance(ql, signed=signed), mesh, pl, sizes)
    return surf.signed_distance(queries, signed=signed)


def grid_sdf(surface: ShardedSurface, layout, *, dtype=torch.float32,
             signed: bool = True) -> torch.Tensor:
    """The signed distance at this rank's grid nodes: a Tensor of ``layout.local_shape(rank)``.

    ``layout`` is a :class:`meshshard.ops.gridpoint.GridLayout` cut over the surface's group
    (in slabs or blocks, one part per rank, or ``None`` sizes: every rank computes the whole
    grid). Collective.
    """
    P, rank = _world(surface.group)
    if layout.parts is not None and layout.parts != P:
        msg = f"grid_sdf: the layout cuts the grid into {layout.parts} parts for {P} ranks"
        raise ValueError(msg)
    nodes = layout.local_nodes(rank, dtype, device=surface.tri.device)
    return surface.signed_distance(nodes, signed=signed).reshape(layout.local_shape(rank))
