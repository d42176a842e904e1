"""A reference DoMINO (arXiv 2501.13350; PhysicsNeMo's recipe) in plain torch.

Structure, for surface (7 neighbours) or volume (10 neighbours) outputs:

1. **Geometry encoding.** Every node of a latent grid ``(D, H, W)`` gathers the STL points
   within several radii (up to ``k`` each, the nearest); an MLP of the relative positions is
   mean-pooled per radius. The pooled features and the grid's signed distance field are the
   grid's channels.
2. **Processor.** Residual 3x3x3 conv blocks on the grid.
3. **Local geometry.** Every sampled point gathers the STL points within small radii (MLP of
   relative positions, mean-pooled) and the grid features at its position (trilinear).
4. **Basis aggregation.** Each sampled point and its ``n_neighbors - 1`` nearest sampled points
   (itself included: 7 or 10) are encoded by a basis MLP of the relative position plus the
   point's features; the per-neighbour predictions are averaged with inverse-distance weights.

Everything that needs the whole domain (ball queries, kNN, neighbour gathers, the conv halo,
grid sampling) goes through a small pluggable ``ops`` object (:class:`LocalOps` here). An ops
object with ``ball_query_sets`` answers the grid nodes' and the sampled points' ball queries
(every radius) in one search, and the model gathers their STL points in one call. The
model imports nothing from meshshard: with ``meshshard.ops.domino_ops.ShardedDominoOps`` the
same module runs domain-parallel on this rank's rows of every input (points sharded, the grid
replicated, cut in slabs along ``D``, or in blocks along ``D`` and ``H`` on a 2-D mesh). Given
ShardTensors, the ops object runs the forward (``ops.run``) and the parameters' gradients of a
global loss are one process's; given each rank's local tensors, each rank's loss and parameter
gradients are its share: sum them over ranks (one all-reduce) to get one process's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DoMINO", "LocalOps"]


class LocalOps:
    """The single-process ops DoMINO calls (brute force; the reference for the sharded ones).

    Conventions: points are ``(x, y, z)``; the grid is ``(C, D, H, W)`` with node ``(d, h, w)``
    at ``origin + (w, h, d) * spacing`` (``F.grid_sample``'s order, ``align_corners=True``).
    """

    def grid_nodes(self, shape, origin, spacing, dtype, device=None) -> torch.Tensor:
        """All nodes (C order) as (G, 3) coordinates, on ``device``."""
        axes = [torch.arange(s, device=device) for s in shape]
        idx = torch.stack([m.reshape(-1) for m in torch.meshgrid(*axes, indexing="ij")], 1)
        return torch.tensor(origin, dtype=dtype, device=device) + idx.flip(-1).to(
            dtype) * torch.tensor(spacing, dtype=dtype, device=device)

    def ball_query(self, points, queries, r: float, k: int) -> torch.Tensor:
        """(m, k) indices of the nearest ``<= k`` points within ``r`` of each query, -1 pad."""
        d = torch.linalg.vector_norm(queries.detach()[:, None] - points.detach()[None], dim=-1)
        d = torch.where(d <= r, d, float("inf"))
        kk = min(k, points.shape[0])
        val, idx = torch.sort(d, dim=1, stable=True)
        idx = torch.where(torch.isfinite(val[:, :kk]), idx[:, :kk], -1)
        return F.pad(idx, (0, k - kk), value=-1)

    def ball_queries(self, points, queries, radii, ks):
        """:meth:`ball_query` for several ``(r, k)`` over the same points and queries, from
        one search: ``(union, [index_i])``, where ``union`` (m, max k) holds the nearest
        ``max k`` within the largest radius and ``index_i`` its first ``k_i`` columns with
        the points beyond ``r_i`` dropped (-1), so one gather by ``union`` serves all."""
        d = torch.linalg.vector_norm(queries.detach()[:, None] - points.detach()[None], dim=-1)
        kmax = max(int(k) for k in ks)
        kk = min(kmax, points.shape[0])
        val, idx = torch.sort(d, dim=1, stable=True)
        val, idx = val[:, :kk], idx[:, :kk]
        union = F.pad(torch.where(val <= max(radii), idx, -1), (0, kmax - kk), value=-1)
        each = []
        for r, k in zip(radii, ks):
            k = int(k)
            part = torch.where(val[:, :k] <= r, idx[:, :k], -1)
            each.append(F.pad(part, (0, k - part.shape[1]), value=-1))
        return union, each

    def ball_query_sets(self, points, sets):
        """:meth:`ball_queries` for several ``(queries, radii, ks)`` over the same points."""
        return [self.ball_queries(points, q, radii, ks) for q, radii, ks in sets]

    def knn(self, points, k: int) -> torch.Tensor:
        """(m, k) indices of each point's k nearest points (itself first)."""
        d = torch.linalg.vector_norm(points.detach()[:, None] - points.detach()[None], dim=-1)
        return torch.sort(d, dim=1, stable=True)[1][:, :k]

    def gather(self, features, index) -> torch.Tensor:
        """Rows of ``features`` at ``index`` (any shape); -1 gives zeros."""
        pool = torch.cat([features, features.new_zeros((1, *features.shape[1:]))])
        return pool[torch.where(index < 0, features.shape[0], index)]

    def halo(self, grid, width: int) -> torch.Tensor:
        """Pad (C, D, H, W) with ``width`` zeros on both sides of every spatial dim (a sharded
        ops object fills the sides its neighbours own with their rows)."""
        return F.pad(grid, (width,) * 6)

    def sample(self, grid, points, origin, spacing, shape) -> torch.Tensor:
        """Trilinear values (m, C) of the grid at physical points (border padding); points
        outside the grid's box raise ``ValueError``."""
        o = torch.tensor(origin, dtype=points.dtype, device=points.device)
        s = torch.tensor(spacing, dtype=points.dtype, device=points.device)
        size = torch.tensor(shape[::-1], dtype=points.dtype, device=points.device)
        hi = o + (size - 1) * s
        tol = 1e-9 * max(spacing)
        out_of = ((points.detach() < o - tol) | (points.detach() > hi + tol)).any(1)
        if not points.is_meta and bool(out_of.any()):  # host sync (no values on meta)
            msg = (f"DoMINO: the grid (box {o.tolist()} .. {hi.tolist()}) does not cover the "
                   f"sampled points: {int(out_of.sum())} lie outside; enlarge the grid or crop")
            raise ValueError(msg)
        c = (points - o) / s / (size - 1).clamp(min=1) * 2 - 1
        out = F.grid_sample(grid[None], c[None, None, None], mode="bilinear",
                            padding_mode="border", align_corners=True)
        return out[0, :, 0, 0].T

    def reduce_mean_count(self, n: int) -> int:
        """The global number of rows (sum over ranks); one process: ``n``."""
        return n


def _mlp(c_in: int, hidden: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(c_in, hidden), nn.GELU(), nn.Linear(hidden, c_out))


def _pool(mlp: nn.Module, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Masked mean over neighbours of ``mlp(rel)``: rel (m, k, 3), valid (m, k) -> (m, C)."""
    f = mlp(rel) * valid[..., None]
    return f.sum(1) / valid.sum(1, keepdim=True).clamp(min=1)


def _encode_balls(ops, mlps, stl_points, queries, radii, ks) -> list[torch.Tensor]:
    """Per radius, the pooled MLP of the relative positions of the STL points in the ball.
    With an ops object that answers several radii at once (``ball_queries``), one search and
    one gather serve them all; otherwise one ball query and one gather per radius."""
    if hasattr(ops, "ball_queries"):
        union, idxs = ops.ball_queries(stl_points, queries, radii, ks)
        rel = ops.gather(stl_points, union) - queries[:, None]
        return [_pool(mlp, rel[:, : idx.shape[1]] / r, idx >= 0)
                for mlp, r, idx in zip(mlps, radii, idxs)]
    out = []
    for mlp, r, k in zip(mlps, radii, ks):
        idx = ops.ball_query(stl_points, queries, r, k)
        rel = ops.gather(stl_points, idx) - queries[:, None]
        out.append(_pool(mlp, rel / r, idx >= 0))
    return out


def _encode_ball_sets(ops, stl_points, sets) -> list[list[torch.Tensor]]:
    """:func:`_encode_balls` for several query sets ``(mlps, queries, radii, ks)`` from one
    ``ops.ball_query_sets`` search and one gather of the STL points."""
    found = ops.ball_query_sets(stl_points, [(q, radii, ks) for _, q, radii, ks in sets])
    flat = torch.cat([union.reshape(-1) for union, _ in found])
    pos = ops.gather(stl_points, flat)
    out, at = [], 0
    for (mlps, queries, radii, _), (union, idxs) in zip(sets, found):
        rel = pos[at : at + union.numel()].reshape(*union.shape, pos.shape[-1]) - queries[:, None]
        at += union.numel()
        out.append([_pool(mlp, rel[:, : idx.shape[1]] / r, idx >= 0)
                    for mlp, r, idx in zip(mlps, radii, idxs)])
    return out


class _ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv3d(c, c, 3)  # ops.halo pads every side
        self.conv2 = nn.Conv3d(c, c, 3)

    def forward(self, x, ops):
        h = F.gelu(_conv(self.conv1, ops.halo(x, 1)))
        return F.gelu(x + _conv(self.conv2, ops.halo(h, 1)))


def _conv(conv: nn.Conv3d, padded: torch.Tensor) -> torch.Tensor:
    """``conv`` (3x3x3, no padding) of an unbatched block ``padded`` (C, D + 2, H + 2, W + 2).

    On the CPU, as three 2-D convs over the ``D`` rows (one per kernel row, the rows as the
    batch): torch runs a single-sample 3-D conv with its native ``slow_conv3d`` unless
    ``C * D * H > 20480`` (``use_mkldnn`` in ATen's Convolution.cpp), ~7x slower than oneDNN
    on a thin slab (16 x 34 x 32 x 32: 0.145 s against 0.020 s, forward and backward, 1
    thread). The batched 2-D convs always take oneDNN. Elsewhere (cuDNN), the 3-D conv.
    An empty block gives no rows but stays on the autograd graph (the halos are collective)."""
    if min(padded.shape[1:]) <= 2:
        return _empty_conv(conv, padded)
    if padded.device.type != "cpu":
        return conv(padded)
    D = padded.shape[1] - 2
    out = None
    for kd in range(3):
        y = F.conv2d(padded[:, kd : kd + D].transpose(0, 1), conv.weight[:, :, kd], None)
        out = y if out is None else out + y
    return (out + conv.bias[None, :, None, None]).transpose(0, 1)


def _empty_conv(conv: nn.Conv3d, padded: torch.Tensor) -> torch.Tensor:
    """A conv over an empty block: no rows out, but on the autograd graph (collective halos)."""
    shape = [max(n - 2, 0) for n in padded.shape[1:]]
    zero = 0 * (padded.sum() + sum(p.sum() for p in conv.parameters()))
    return padded.new_zeros((conv.out_channels, *shape)) + zero


class DoMINO(nn.Module):
    """Reference DoMINO; small by default, the recipe's sizes through the arguments.

    Parameters
    ----------
    grid_shape : (D, H, W)
        Latent grid (the recipe: 128 x 64 x 64 along the car's long axis, height, width).
    origin, spacing : (x, y, z)
        Physical position of node (0, 0, 0) and node distance; the grid must cover the points.
    radii, neighbors : per-radius ball-query radius and cap for the geometry encoding
        (recipe: radii 0.1-2.5, 32-256 neighbours).
    local_radii, local_neighbors : the same for the local geometry around sampled points
        (recipe: 0.05-0.25).
    n_neighbors : int
        Points in the basis aggregation: 7 (surface) or 10 (volume).
    point_features : int
        Extra per-point input channels (e.g. normals and area for surface points, the SDF for
        volume points).
    out_channels : int
        Predicted fields (e.g. 4: pressure and wall shear stress; 5: velocity, pressure, nut).
    """

    def __init__(self, grid_shape: Sequence[int] = (8, 6, 6), origin=(0.0, 0.0, 0.0),
                 spacing=(0.2, 0.2, 0.2), *, radii=(0.2, 0.4), neighbors=(8, 16),
                 local_radii=(0.1, 0.2), local_neighbors=(8, 8), n_neighbors: int = 7,
                 point_features: int = 0, out_channels: int = 4, geo_channels: int = 8,
                 hidden: int = 32, blocks: int = 2, ops=None):
        super().__init__()
        if len(radii) != len(neighbors) or len(local_radii) != len(local_neighbors):
            msg = "DoMINO: radii/neighbors and local_radii/local_neighbors must pair up"
            raise ValueError(msg)
        for r in (*radii, *local_radii):
            if not r > 0:
                msg = f"DoMINO: radius {r} must be > 0"
                raise ValueError(msg)
        self.grid_shape = tuple(int(s) for s in grid_shape)
        self.origin, self.spacing = tuple(origin), tuple(spacing)
        self.radii, self.neighbors = tuple(radii), tuple(int(k) for k in neighbors)
        self.local_radii = tuple(local_radii)
        self.local_neighbors = tuple(int(k) for k in local_neighbors)
        self.n_neighbors = int(n_neighbors)
        self.ops = ops if ops is not None else LocalOps()
        self.geo = nn.ModuleList(_mlp(3, hidden, geo_channels) for _ in radii)
        c = geo_channels * len(radii) + 1
        self.lift = nn.Linear(c, hidden)  # a 1x1x1 conv, per node (empty slabs too)
        self.blocks = nn.ModuleList(_ResBlock(hidden) for _ in range(blocks))
        self.local = nn.ModuleList(_mlp(3, hidden, geo_channels) for _ in local_radii)
        c_pt = hidden + geo_channels * len(local_radii) + point_features
        self.encode = _mlp(c_pt, hidden, hidden)
        self.basis = _mlp(3 + hidden, hidden, out_channels)

    def encode_grid(self, stl_points: torch.Tensor, sdf_grid: torch.Tensor,
                    feats: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Geometry encoding + processor: (hidden, D_local, H_local, W) for this rank's block.
        ``feats``: the per-radius pooled features of the grid nodes, when already computed."""
        ops = self.ops
        if feats is None:
            nodes = ops.grid_nodes(self.grid_shape, self.origin, self.spacing, stl_points.dtype,
                                   device=stl_points.device)
            feats = _encode_balls(ops, self.geo, stl_points, nodes, self.radii, self.neighbors)
        g = torch.cat([*feats, sdf_grid.reshape(-1, 1).to(stl_points.dtype)], 1)
        x = self.lift(g)
        x = x.T.reshape(x.shape[1], *sdf_grid.shape)
        for blk in self.blocks:
            x = blk(x, ops)
        return x

    def forward(self, stl_points: torch.Tensor, sdf_grid: torch.Tensor, points: torch.Tensor,
                point_features: torch.Tensor | None = None) -> torch.Tensor:
        """Predict the fields at ``points``.

        Parameters
        ----------
        stl_points : (N, 3) STL points (this rank's rows when sharded)
        sdf_grid : (D_local, H_local, W) the grid's signed distance field (this rank's block)
        points : (M, 3) sampled surface / volume points
        point_features : (M, point_features), optional

        Returns
        -------
        Tensor (M, out_channels)

        With ``ShardedDominoOps`` the inputs may also be ShardTensors (see its ``run``): the
        output is then a ShardTensor laid out like ``points``, and the parameters' gradients
        of a global loss are one process's.
        """
        ops = self.ops
        if hasattr(ops, "run"):  # the ops object may run this forward itself (ShardTensors)
            out = ops.run(self, stl_points, sdf_grid, points, point_features)
            if out is not NotImplemented:
                return out
        if hasattr(ops, "ball_query_sets"):  # grid nodes and points: one search, one gather
            nodes = ops.grid_nodes(self.grid_shape, self.origin, self.spacing, stl_points.dtype,
                                   device=stl_points.device)
            geo, local = _encode_ball_sets(ops, stl_points, [
                (self.geo, nodes, self.radii, self.neighbors),
                (self.local, points, self.local_radii, self.local_neighbors)])
        else:
            geo, local = None, _encode_balls(ops, self.local, stl_points, points,
                                             self.local_radii, self.local_neighbors)
        grid = self.encode_grid(stl_points, sdf_grid, geo)
        at = ops.sample(grid, points, self.origin, self.spacing, self.grid_shape)
        feats = [at, *local]
        if point_features is not None:
            feats.append(point_features.to(points.dtype))
        h = self.encode(torch.cat(feats, 1))
        nb = ops.knn(points, self.n_neighbors)  # (M, K), itself first
        both = ops.gather(torch.cat([points.to(h.dtype), h], 1), nb)  # one gather for both
        rel = both[..., :3] - points[:, None]
        hn = both[..., 3:]
        pred = self.basis(torch.cat([rel, hn], -1))  # (M, K, out)
        w = 1.0 / (torch.linalg.vector_norm(rel, dim=-1) + 1e-6 * self.spacing[0])
        w = torch.where(nb >= 0, w, 0)
        return (pred * w[..., None]).sum(1) / w.sum(1, keepdim=True)
