"""Batched trilinear (bilinear in 2-D) sampling of a sharded grid at sharded points, with the
coordinate conventions of ``F.grid_sample``, on a device mesh of any shape.

``grid`` is ``(B, C, D, H, W)`` (or ``(B, C, H, W)``); ``coords`` is ``(B, N, ndim)`` in
``F.grid_sample``'s normalised ``(x, y, z)`` order (``x`` along ``W``), and the result is
``(B, N, C)``, which equals ``F.grid_sample(grid, coords[:, None, None], mode="bilinear",
padding_mode=..., align_corners=...)[:, :, 0, 0].transpose(1, 2)`` (2-D: ``coords[:, None]``).

Layouts, per mesh dim: the grid is ``Shard(2 + a)`` (cut along spatial dim ``a``, uneven, empty
and one-row slabs allowed) or ``Replicate``; ``coords`` is ``Shard(1)`` (points) on at most one
mesh dim and ``Replicate`` elsewhere; the batch is never cut. On the points' mesh dim, each
point travels only to the ranks owning its cell's two rows along the cut (one uneven all-to-all
there and back). On a mesh dim where the grid is cut but the points are replicated, each rank
adds the corners it owns and one all-reduce sums them. Nothing else moves. Differentiable with
respect to the grid and the coordinates, like ``F.grid_sample``.

Collective over the mesh (forward and backward) for ShardTensor inputs. Host syncs: one per
call where points travel (the all-to-all's counts), plus the count exchange's own.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as tF

from meshshard.comm.check import check_collective
from meshshard.comm.rows import all_to_all, exchange_counts
from meshshard.ops._consts import device_const
from meshshard.ops.api import _is_st
from meshshard.shardtensor import Replicate, Shard, from_local

__all__ = ["grid_sample"]

_PADDING = ("zeros", "border")


class _SumReplicate(torch.autograd.Function):
    """Partial -> Replicate: all-reduce sum forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        x = x.clone()
        check_collective("all_reduce", group, x, detail="grid_sample partial corners")
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None


class _GradSum(torch.autograd.Function):
    """Replicate input used by per-rank work: identity forward, all-reduce of the gradient."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        grad = grad.contiguous().clone()
        check_collective("all_reduce", ctx.group, grad, detail="grid_sample replicated grad")
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _unnormalize(c: torch.Tensor, size: torch.Tensor, align_corners: bool) -> torch.Tensor:
    if align_corners:
        return (c + 1) / 2 * (size - 1)
    return ((c + 1) * size - 1) / 2


def _index_coords(c, shape, align_corners, padding_mode):
    """(n, k) normalised (x, y, z) -> (n, k) index coordinates in (d, h, w) order."""
    size = device_const(shape, c.dtype, c.device)
    u = _unnormalize(c.flip(-1), size, align_corners)
    if padding_mode == "border":
        u = torch.minimum(torch.clamp(u, min=0), size - 1)
    return u


def _partial_sample(grid_l, b, u, shape, own):
    """Sum over the cell corners this rank owns: grid_l (B, C, *local), u (n, k) in global
    index coordinates, own = [(row0, rows)] per spatial dim. Returns (n, C)."""
    k = len(shape)
    lo = torch.floor(u.detach()).long()
    frac = u - lo.to(u.dtype)
    B, C = grid_l.shape[:2]
    local = [r for _, r in own]
    flat_g = grid_l.reshape(B, C, -1)
    out = u.new_zeros((u.shape[0], C))
    if u.shape[0] == 0 or flat_g.shape[-1] == 0:
        # stay on the autograd graph: the all-to-all backward must run on every rank
        return out + 0 * (flat_g.sum() + u.sum())
    for bits in range(2**k):
        ok = torch.ones(u.shape[0], dtype=torch.bool, device=u.device)
        flat = torch.zeros(u.shape[0], dtype=torch.int64, device=u.device)
        w = None
        for j in range(k):
            bj = (bits >> (k - 1 - j)) & 1
            idx = lo[:, j] + bj
            ok &= (idx >= 0) & (idx < shape[j])
            loc = idx - own[j][0]
            ok &= (loc >= 0) & (loc < local[j])
            flat = flat * local[j] + loc.clamp(0, max(local[j] - 1, 0))
            f = frac[:, j] if bj else 1 - frac[:, j]
            w = f if w is None else w * f
        vals = flat_g[b, :, flat]  # (n, C)
        out = out + torch.where(ok[:, None], vals * w[:, None], 0)
    return out


def _layouts(grid, coords):
    mesh = grid.device_mesh
    if coords.device_mesh != mesh:
        msg = "grid_sample: grid and coords live on different device meshes"
        raise ValueError(msg)
    gaxes, route = {}, None
    for m, (gp, cp) in enumerate(zip(grid.placements, coords.placements)):
        if isinstance(gp, Shard):
            if gp.dim < 2:
                msg = (f"grid_sample: the grid (B, C, *S) may be cut along spatial dims only, got "
                       f"Shard({gp.dim}) on mesh dim {m}")
                raise ValueError(msg)
            if gp.dim - 2 in gaxes.values():
                msg = f"grid_sample: the grid is cut twice along spatial dim {gp.dim - 2}"
                raise ValueError(msg)
            gaxes[m] = gp.dim - 2
        elif not isinstance(gp, Replicate):
            msg = f"grid_sample: grid placement {gp} on mesh dim {m} must be Shard or Replicate"
            raise ValueError(msg)
        if isinstance(cp, Shard):
            if cp.dim != 1 or route is not None:
                msg = (f"grid_sample: coords (B, N, k) must be Shard(1) on at most one mesh dim, "
                       f"got placements {tuple(coords.placements)}")
                raise ValueError(msg)
            route = m
        elif not isinstance(cp, Replicate):
            msg = f"grid_sample: coords placement {cp} on mesh dim {m} must be Shard or Replicate"
            raise ValueError(msg)
    return mesh, gaxes, route


def grid_sample(grid, coords, *, align_corners: bool = False, padding_mode: str = "zeros"):
    """Sample ``grid`` (B, C, *S) at normalised ``coords`` (B, N, k) -> (B, N, C), bilinearly.

    Parameters
    ----------
    grid : ShardTensor or Tensor of shape (B, C, D, H, W) or (B, C, H, W)
    coords : ShardTensor or Tensor of shape (B, N, k), ``k = len(S)``
        In [-1, 1], ``(x, y, z)`` order, as ``F.grid_sample``'s ``grid`` argument. Use
        :meth:`meshshard.ops.gridpoint.GridLayout.normalize` for physical coordinates.
    align_corners : bool
        As in ``F.grid_sample``: ``True`` puts -1 / 1 on the outer nodes, ``False`` on the outer
        cell faces.
    padding_mode : {"zeros", "border"}

    Returns
    -------
    ShardTensor (placed like ``coords``) or Tensor of shape (B, N, C)

    Raises
    ------
    ValueError
        Unknown padding mode, mismatched shapes, unsupported placements.
    """
    if padding_mode not in _PADDING:
        msg = f"grid_sample: padding_mode={padding_mode!r} must be one of {_PADDING}"
        raise ValueError(msg)
    k = grid.ndim - 2
    if k not in (2, 3) or coords.ndim != 3 or coords.shape[-1] != k:
        msg = (f"grid_sample: grid must be (B, C, *S) with 2 or 3 spatial dims and coords "
               f"(B, N, {k}); got {tuple(grid.shape)} and {tuple(coords.shape)}")
        raise ValueError(msg)
    if grid.shape[0] != coords.shape[0]:
        msg = f"grid_sample: batch sizes differ: grid {grid.shape[0]}, coords {coords.shape[0]}"
        raise ValueError(msg)
    if not (_is_st(grid) or _is_st(coords)):
        c = coords[:, None, None] if k == 3 else coords[:, None]
        out = tF.grid_sample(grid, c, mode="bilinear", padding_mode=padding_mode,
                             align_corners=align_corners)
        return out.reshape(grid.shape[0], grid.shape[1], coords.shape[1]).transpose(1, 2)
    if not (_is_st(grid) and _is_st(coords)):
        msg = "grid_sample: pass grid and coords both as ShardTensors (or both as Tensors)"
        raise TypeError(msg)
    return _sharded(grid, coords, k, align_corners, padding_mode)


def _sharded(grid, coords, k, align_corners, padding_mode):
    mesh, gaxes, route = _layouts(grid, coords)
    shape = list(grid.shape[2:])
    B = grid.shape[0]
    gl, cl = grid.to_local(), coords.to_local()
    own = [(0, s) for s in shape]
    for m, a in gaxes.items():
        sizes = grid.sharding_sizes(m)
        me = mesh.get_local_rank(m)
        own[a] = (sum(sizes[:me]), sizes[me])
    if route is not None and route not in gaxes and gl.requires_grad:
        # points cut, grid whole on this mesh dim: every rank's reads feed the grid's gradient
        gl = _GradSum.apply(gl, mesh.get_group(route))
    for m in gaxes:
        if m != route and cl.requires_grad:  # replicated points read partial corners here
            cl = _GradSum.apply(cl, mesh.get_group(m))
    n = cl.shape[1]
    u = _index_coords(cl.reshape(-1, k), shape, align_corners, padding_mode)
    b = torch.arange(B, device=u.device).repeat_interleave(n)
    if route is not None and route in gaxes:
        a = gaxes[route]
        group = mesh.get_group(route)
        sizes = grid.sharding_sizes(route)
        P = len(sizes)
        cuts = [sum(sizes[: i + 1]) for i in range(P)]
        bounds = device_const([0, *cuts], torch.int64, u.device)
        lo = torch.floor(u[:, a].detach()).long()
        # each point goes to the owners of its rows lo and lo + 1 (one copy when they are the
        # same rank); P marks "nowhere". Sorting the (owner, point) keys routes them with no
        # size read back but the counts (one host sync)
        owners, valids = [], []
        for off in (0, 1):
            row = lo + off
            valids.append((row >= 0) & (row < shape[a]))
            owner = torch.searchsorted(bounds, row.clamp(0, shape[a] - 1), right=True) - 1
            owners.append(owner.clamp(0, P - 1))
        valids[1] = valids[1] & ~(valids[0] & (owners[1] == owners[0]))
        npts = u.shape[0]
        dest = torch.cat([torch.where(v, o, P) for o, v in zip(owners, valids)])
        pid = torch.arange(npts, device=u.device).repeat(2)
        order = torch.argsort(dest * max(npts, 1) + pid)  # by owner, then point
        counts = torch.zeros(P + 1, dtype=torch.int64, device=u.device).index_add_(
            0, dest, torch.ones_like(dest))
        send = counts[:P].tolist()  # host sync: the all-to-all's counts
        order = order[: sum(send)]
        dest, pid = dest.index_select(0, order), pid.index_select(0, order)
        recv = exchange_counts(send, group, u.device)
        ru = all_to_all(u.index_select(0, pid), send, recv, group)
        rb = all_to_all(b.index_select(0, pid), send, recv, group)
        part = _partial_sample(gl, rb, ru, shape, own)
        back = all_to_all(part, recv, send, group)
        out = u.new_zeros((u.shape[0], gl.shape[1])).index_add(0, pid, back)
    else:
        out = _partial_sample(gl, b, u, shape, own)
    for m in gaxes:
        if m != route:
            out = _SumReplicate.apply(out, mesh.get_group(m))
    out = out.reshape(B, n, gl.shape[1])
    shapes = None if route is None else {route: list(coords.sharding_sizes(route))}
    return from_local(out, mesh, list(coords.placements), sharding_shapes=shapes, validate=False)
