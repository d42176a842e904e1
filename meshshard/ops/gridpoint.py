"""Ball queries and kNN between the nodes of a (sharded) regular grid and a sharded point cloud.

The grid is described, not materialised: a :class:`GridLayout` gives its shape ``(D, H, W)``,
the physical position of node ``(0, 0, 0)`` and the spacing, both in ``(x, y, z)`` order as
``F.grid_sample`` reads coordinates (``x`` runs along ``W``, ``z`` along ``D``), and how it is
cut: ``sizes[r]`` rows of spatial dim ``axis`` (0 = D, 1 = H, 2 = W) on rank ``r`` of the
points' mesh dim, blocks cut along two or three axes (``axis=(0, 1)``, ``sizes=(d_sizes,
h_sizes)``; rank ``r`` of the points' group holds block ``r`` in row-major order), or ``None``
for a replicated grid. Node ``(d, h, w)`` sits at
``origin + (w, h, d) * spacing``. Each rank builds only the coordinates of its own slab, and the
exact distributed radius / kNN of :mod:`meshshard.ops.functional` does the rest.

Grid indices are global C-order flat indices ``(d * H + h) * W + w`` of the whole grid, whatever
the cut; point indices are global stored-order row indices (rank order). Distances are
differentiable with respect to the points.

Every function here is collective over the points' mesh dim (forward, and backward).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from meshshard.comm.rows import all_gather_rows
from meshshard.ops import functional as F
from meshshard.ops._consts import device_const
from meshshard.ops.api import _is_st, _layout, _wrap, _wrap_inferred
from meshshard.shardtensor import Replicate

__all__ = ["GridLayout", "grid_knn", "grid_radius"]

_DIRECTIONS = ("grid_to_points", "points_to_grid")


def _triple(v, name: str, n: int) -> tuple[float, ...]:
    if isinstance(v, (int, float)):
        v = (float(v),) * n
    v = tuple(float(a) for a in v)
    if len(v) != n:
        msg = f"GridLayout: {name} needs {n} values in (x, y, z) order, got {len(v)}"
        raise ValueError(msg)
    return v


@dataclass(frozen=True)
class GridLayout:
    """A regular grid of nodes and how it is cut into slabs (or blocks) over ranks.

    Parameters
    ----------
    shape : sequence of int
        ``(D, H, W)`` (or ``(H, W)`` / ``(W,)``), the tensor order of ``F.grid_sample``.
    origin, spacing : float or sequence of float
        Position of node ``(0, ..., 0)`` and node distance, in ``(x, y, z)`` order (reverse of
        ``shape``). ``spacing > 0``.
    sizes : sequence of int, or a sequence of them (one per cut axis), optional
        Rows of spatial dim ``axis`` on each rank (sum ``shape[axis]``; zeros allowed);
        ``None``: every rank holds the whole grid. With several axes, ``sizes[k]`` cuts
        ``axis[k]`` and rank ``r`` holds block ``r`` in row-major order of the cuts: on a
        2-D cut ``(len(sizes[0]), len(sizes[1]))`` blocks, rank ``a * len(sizes[1]) + b``
        holds rows ``sizes[0][a]`` x ``sizes[1][b]`` (the rank order of a 2-D DeviceMesh of
        that shape).
    axis : int or sequence of int
        The cut spatial dim(s) (0 = the first of ``shape``).

    Raises
    ------
    ValueError
        Non-positive shape or spacing, sizes that do not sum to ``shape[axis]``, repeated or
        out-of-range axes.
    """

    shape: tuple[int, ...]
    origin: tuple[float, ...] = 0.0  # type: ignore[assignment]
    spacing: tuple[float, ...] = 1.0  # type: ignore[assignment]
    sizes: tuple | None = None
    axis: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        if not shape or any(s < 1 for s in shape):
            msg = f"GridLayout: shape={self.shape} must be 1-3 positive ints"
            raise ValueError(msg)
        n = len(shape)
        origin, spacing = _triple(self.origin, "origin", n), _triple(self.spacing, "spacing", n)
        if any(not s > 0 for s in spacing):
            msg = f"GridLayout: spacing={spacing} must be > 0"
            raise ValueError(msg)
        multi = not isinstance(self.axis, int)
        axes = tuple(int(a) for a in self.axis) if multi else (int(self.axis),)
        if not axes or any(not 0 <= a < n for a in axes) or len(set(axes)) != len(axes):
            msg = (f"GridLayout: axis={self.axis} must name distinct ones of the {n} spatial "
                   "dims")
            raise ValueError(msg)
        sizes = None
        if self.sizes is not None:
            cuts = tuple(self.sizes) if multi else (self.sizes,)
            if len(cuts) != len(axes) or any(isinstance(c, int) for c in cuts):
                msg = (f"GridLayout: axis={self.axis} needs sizes as one sequence per cut axis, "
                       f"got {self.sizes!r}")
                raise ValueError(msg)
            cuts = tuple(tuple(int(s) for s in c) for c in cuts)
            for a, c in zip(axes, cuts):
                if any(s < 0 for s in c) or sum(c) != shape[a]:
                    msg = (f"GridLayout: sizes={list(c)} must be >= 0 and sum to shape[{a}]"
                           f"={shape[a]}")
                    raise ValueError(msg)
            sizes = cuts if multi else cuts[0]
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "spacing", spacing)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "axis", axes if multi else axes[0])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def cuts(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """``(axis, sizes)`` of every cut axis (empty when replicated)."""
        if self.sizes is None:
            return ()
        if isinstance(self.axis, int):
            return ((self.axis, self.sizes),)
        return tuple(zip(self.axis, self.sizes))

    @property
    def parts(self) -> int | None:
        """The number of ranks the grid is cut over (``None``: replicated)."""
        if self.sizes is None:
            return None
        return math.prod(len(c) for _, c in self.cuts)

    def block(self, rank: int) -> tuple[tuple[int, int], ...]:
        """``(first row, row count)`` of ``rank``'s block along every spatial dim."""
        out = [(0, s) for s in self.shape]
        rest = rank
        for a, c in reversed(self.cuts):  # row-major: the last cut varies fastest
            i = rest % len(c)
            rest //= len(c)
            out[a] = (sum(c[:i]), c[i])
        return tuple(out)

    def rows(self, rank: int) -> tuple[int, int]:
        """``(first row, row count)`` of ``rank``'s slab along ``axis`` (all rows if replicated);
        for a grid cut along one axis (see :meth:`block` otherwise)."""
        if not isinstance(self.axis, int):
            msg = f"GridLayout.rows: the grid is cut along axes {self.axis}; use block(rank)"
            raise ValueError(msg)
        return self.block(rank)[self.axis]

    def local_shape(self, rank: int) -> tuple[int, ...]:
        return tuple(n for _, n in self.block(rank))

    def node_counts(self, world: int) -> list[int]:
        """Nodes held by every rank (``None`` sizes: all on every rank)."""
        return [math.prod(self.local_shape(r)) for r in range(world)]

    def local_index(self, rank: int, device=None) -> torch.Tensor:
        """``(n_local, ndim)`` int64 global ``(d, h, w)`` indices of ``rank``'s nodes, C order."""
        axes = [torch.arange(r0, r0 + n, device=device) for r0, n in self.block(rank)]
        mesh = torch.meshgrid(*axes, indexing="ij")
        return torch.stack([m.reshape(-1) for m in mesh], 1)

    def coords(self, index: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
        """Physical ``(x, y, z)`` coordinates of integer ``(d, h, w)`` node indices."""
        o = device_const(self.origin, dtype, index.device)
        s = device_const(self.spacing, dtype, index.device)
        return o + index.flip(-1).to(dtype) * s

    def local_nodes(self, rank: int, dtype=torch.float32, device=None) -> torch.Tensor:
        """Physical coordinates ``(n_local, ndim)`` of ``rank``'s nodes (C order of its slab)."""
        return self.coords(self.local_index(rank, device), dtype)

    def flat(self, index: torch.Tensor) -> torch.Tensor:
        """Global C-order flat indices of ``(..., ndim)`` node indices."""
        out = torch.zeros(index.shape[:-1], dtype=torch.int64, device=index.device)
        for j, s in enumerate(self.shape):
            out = out * s + index[..., j]
        return out

    def normalize(self, points: torch.Tensor, align_corners: bool = True) -> torch.Tensor:
        """``F.grid_sample`` coordinates in [-1, 1] of physical ``(x, y, z)`` points.

        With ``align_corners=True`` the outer nodes map to -1 and 1; with ``False`` the outer
        cell faces (half a spacing beyond the outer nodes) do.
        """
        o = device_const(self.origin, points.dtype, points.device)
        s = device_const(self.spacing, points.dtype, points.device)
        size = device_const(self.shape[::-1], points.dtype, points.device)
        u = (points - o) / s
        if align_corners:
            return u / torch.clamp(size - 1, min=1) * 2 - 1
        return (u + 0.5) / size * 2 - 1

    def check_covers(self, points: torch.Tensor, group: dist.ProcessGroup | None = None,
                     *, what: str = "points") -> None:
        """Raise on every rank when any rank's points lie outside the grid's box.

        Counts on the points' device (nothing copied to the host but one count per rank):
        one small all-gather and one host sync (the counts read back).

        Collective: every rank of ``group`` must call this.
        """
        dev = points.device
        o = [float(v) for v in self.origin]
        hi = [a + (n - 1) * b for a, n, b in zip(o, self.shape[::-1], self.spacing)]
        tol = 1e-9 * max(self.spacing)
        p = points.detach().double()
        lo_t = device_const([v - tol for v in o], torch.float64, dev)
        hi_t = device_const([v + tol for v in hi], torch.float64, dev)
        bad = ((p < lo_t) | (p > hi_t)).any(-1).sum() if p.numel() else p.new_zeros(())
        row = bad.to(torch.float64).reshape(1)
        if group is not None or (dist.is_available() and dist.is_initialized()):
            row = all_gather_rows(row, group).reshape(-1)
        counts = [int(v) for v in row.tolist()]  # host sync: the verdict
        if sum(counts) > 0:
            ranks = [i for i, v in enumerate(counts) if v > 0]
            msg = (f"the grid (box {o} .. {hi}) does not cover the {what}: "
                   f"{sum(counts)} lie outside (on ranks {ranks}); enlarge the grid's origin/"
                   f"shape or crop the {what}")
            raise ValueError(msg)


def _unwrap(points, group):
    """(local, group, mesh, placements, sizes) of a ShardTensor (Shard(0)) or a local Tensor."""
    if _is_st(points):
        pl, mesh, place, _md, sizes, g = _layout(points, "points", "grid query")
        return pl, g, mesh, place, sizes
    return points, group, None, None, None


def _world(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _my_nodes(layout: GridLayout, world: int, rank: int, dtype, device, op: str) -> torch.Tensor:
    if layout.parts is not None and layout.parts != world:
        msg = (f"{op}: the layout cuts the grid into {layout.parts} parts but the points' mesh "
               f"dim (or group) has {world} ranks")
        raise ValueError(msg)
    return layout.local_nodes(rank, dtype, device)


def _to_grid_index(g: torch.Tensor, layout: GridLayout, counts: Sequence[int]) -> torch.Tensor:
    """Stored-order node indices (rank slabs concatenated) -> global C-order flat indices."""
    valid = g >= 0
    gg = torch.where(valid, g, 0)
    offs = torch.tensor([0, *counts], device=g.device).cumsum(0)
    owner = torch.searchsorted(offs, gg, right=True) - 1
    out = torch.full_like(g, -1)
    for r in range(len(counts)):
        sel = valid & (owner == r)
        if not bool(sel.any()):
            continue
        loc = gg[sel] - offs[r]
        ls = layout.local_shape(r)
        idx = []
        for s in reversed(ls):
            idx.append(loc % s)
            loc = loc // s
        idx = torch.stack(idx[::-1], -1)
        idx += torch.tensor([r0 for r0, _ in layout.block(r)], device=idx.device)
        out[sel] = layout.flat(idx)
    return out


def _query(points, layout: GridLayout, direction: str, group, op: str, call):
    if direction not in _DIRECTIONS:
        msg = f"{op}: direction={direction!r} must be one of {_DIRECTIONS}"
        raise ValueError(msg)
    pl, g, mesh, place, psizes = _unwrap(points, group)
    world, rank = _world(g)
    nodes = _my_nodes(layout, world, rank, pl.dtype, pl.device, op)
    if direction == "grid_to_points":
        d, i = call(pl, nodes, g)  # grid nodes query the points
        if mesh is None:
            return d, i
        if layout.sizes is None:  # every rank asked for all nodes: replicated result
            rep = [Replicate()] * mesh.ndim
            return _wrap_inferred(d, mesh, rep), _wrap_inferred(i, mesh, rep)
        counts = layout.node_counts(world)
        return _wrap(d, mesh, place, counts), _wrap(i, mesh, place, counts)
    if layout.sizes is None and rank != 0:  # a replicated grid is contributed once, by rank 0
        nodes = nodes[:0]
    counts = [0] * world
    if layout.sizes is None:
        counts[0] = math.prod(layout.shape)
    else:
        counts = layout.node_counts(world)
    d, i = call(nodes, pl, g)
    i = _to_grid_index(i, layout, counts)
    if i.numel():  # order each row by (distance, flat grid index), padding last
        o = torch.argsort(torch.where(i < 0, torch.iinfo(torch.int64).max, i), dim=1, stable=True)
        d, i = d.gather(1, o), i.gather(1, o)
        o = torch.argsort(d.detach(), dim=1, stable=True)
        d, i = d.gather(1, o), i.gather(1, o)
    if mesh is None:
        return d, i
    return _wrap(d, mesh, place, psizes), _wrap(i, mesh, place, psizes)


def grid_radius(
    points,
    r: float,
    layout: GridLayout,
    *,
    direction: str = "grid_to_points",
    max_num_neighbors: int | None = None,
    group: dist.ProcessGroup | None = None,
    backend: str = "auto",
):
    """Exact ball query between the grid's nodes and the points (``<= r``, nearest first).

    Collective: every rank of the points' mesh dim (or ``group``) must call this.

    Parameters
    ----------
    points : ShardTensor of global shape (N, ndim), Shard(0) — or this rank's Tensor with ``group``
        Physical ``(x, y, z)`` coordinates.
    r : float
        Radius, > 0.
    layout : GridLayout
        The grid; ``layout.sizes`` has one entry per rank of the points' mesh dim (or None).
    direction : {"grid_to_points", "points_to_grid"}
        ``"grid_to_points"``: every node of this rank's slab finds the points around it (the
        DoMINO geometry encoder). ``"points_to_grid"``: every point finds the nodes around it.
    max_num_neighbors : int, optional
        Keep the closest ones (ties by index).

    Returns
    -------
    dist, index : (M, W) padded with ``inf`` / ``-1``
        ``grid_to_points``: rows are this rank's nodes (C order of its slab; a ShardTensor sharded
        by node counts, Replicate for a replicated grid), ``index`` global point rows.
        ``points_to_grid``: rows are the points (sharded like them), ``index`` global C-order
        flat node indices.

    Raises
    ------
    ValueError
        ``r <= 0``, layout sizes that do not match the ranks, a bad direction.
    """

    def call(x, y, g):
        return F.radius(x, r, y, max_num_neighbors=max_num_neighbors, group=g, backend=backend)

    return _query(points, layout, direction, group, "grid_radius", call)


def grid_knn(
    points,
    k: int,
    layout: GridLayout,
    *,
    direction: str = "grid_to_points",
    group: dist.ProcessGroup | None = None,
    backend: str = "auto",
):
    """Exact k nearest neighbours between the grid's nodes and the points.

    Same conventions as :func:`grid_radius`; returns ``(dist, index)`` of shape (M, k),
    ascending, ties by the lower index. Collective.
    """

    def call(x, y, g):
        return F.knn(x, k, y, group=g, backend=backend)

    return _query(points, layout, direction, group, "grid_knn", call)
