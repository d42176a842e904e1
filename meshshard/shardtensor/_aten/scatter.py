"""``scatter``: one rank's whole tensor cut into uneven pieces and sent out as a ShardTensor
(e.g. a Partition's sizes), differentiable: the gradient pieces travel back to the source."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard

from meshshard.comm.check import check_collective
from meshshard.errors import LayoutError
from meshshard.shardtensor._aten.dispatch import _coord, _fc, check
from meshshard.shardtensor._aten.layout_args import comm_device
from meshshard.shardtensor._aten.tensor import ShardTensor, _FromLocal, make_spec

__all__ = ["scatter"]

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def scatter(
    tensor: torch.Tensor | None,
    mesh,
    sizes: Sequence[int],
    *,
    src: int = 0,
    dim: int = 0,
    mesh_dim: int = 0,
) -> ShardTensor:
    """Split ``tensor`` held by coordinate ``src`` of ``mesh_dim`` into pieces of ``sizes``
    along ``dim`` and send piece ``r`` to coordinate ``r``; other ranks pass ``None``.

    Collective over ``mesh_dim`` (shape and dtype are broadcast from ``src``, so a bad call
    raises on every rank). Differentiable: gradients flow back to ``src``'s tensor.
    """
    n = mesh.size(mesh_dim)
    me = mesh.get_local_rank(mesh_dim)
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) != n or any(s < 0 for s in sizes):
        msg = f"scatter: sizes {sizes} must have {n} non-negative entries (one per rank)"
        raise LayoutError(msg)
    if not 0 <= src < n:
        msg = f"scatter: src={src} is not a coordinate of mesh dim {mesh_dim} (size {n})"
        raise LayoutError(msg)
    meta = torch.zeros(18, dtype=torch.int64, device=comm_device(mesh))
    if me == src:
        if not isinstance(tensor, torch.Tensor) or isinstance(tensor, ShardTensor):
            msg = "scatter: the src rank must pass a plain torch.Tensor"
            raise TypeError(msg)
        d = dim + tensor.ndim if dim < 0 else dim
        ok = int(0 <= d < tensor.ndim and sum(sizes) == tensor.shape[d]) if tensor.ndim <= 15 \
            else 0
        dt = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else -1
        meta[:3] = torch.tensor([ok, dt, tensor.ndim])
        if tensor.ndim <= 15:
            meta[3 : 3 + tensor.ndim] = torch.tensor(tensor.shape)
    if n > 1:
        group = mesh.get_group(mesh_dim)
        src_global = dist.get_global_rank(group, src)
        check_collective("broadcast", group, meta, detail=f"scatter metadata from {src_global}")
        dist.broadcast(meta, src=src_global, group=group)
    ok, dt, ndim = (int(v) for v in meta[:3].tolist())
    shape = meta[3 : 3 + ndim].tolist()
    if not ok:
        d = dim + ndim if dim < 0 else dim
        got = shape[d] if 0 <= d < ndim else None
        msg = (f"scatter: sizes {sizes} (sum {sum(sizes)}) do not cut dim {dim} of the src "
               f"tensor of shape {tuple(shape)} (its size there: {got})")
        raise LayoutError(msg)
    if dt < 0:
        msg = f"scatter: unsupported dtype; use one of {', '.join(str(t) for t in _DTYPES)}"
        raise TypeError(msg)
    d = dim + ndim if dim < 0 else dim
    if me == src:
        x = tensor
    else:
        rest = list(shape)
        rest[d] = 0
        x = torch.empty(rest, dtype=_DTYPES[dt], device=comm_device(mesh))
    local = _Scatter.apply(x, mesh, mesh_dim, sizes, src, d)
    placements = [Replicate()] * mesh.ndim
    placements[mesh_dim] = Shard(d)
    spec_sizes: list = [None] * mesh.ndim
    spec_sizes[mesh_dim] = sizes
    spec = make_spec(mesh, tuple(placements), tuple(spec_sizes), tuple(shape))

    return _FromLocal.apply(local, spec)


def _a2a(x: torch.Tensor, send: list, recv: list, mesh, i: int, what: str) -> torch.Tensor:
    if mesh.size(i) == 1:
        return x
    x = x.contiguous()
    check("all_to_all", mesh, i, x, what, varying_dim=0)
    return _fc.wait_tensor(_fc.all_to_all_single(x, recv, send, _coord(mesh)[2][i]))


class _Scatter(torch.autograd.Function):
    """Rows of dim ``d`` from ``src`` to their owners; the backward sends them back."""

    @staticmethod
    def forward(ctx, x, mesh, i, sizes, src, d):
        n, me = mesh.size(i), mesh.get_local_rank(i)
        ctx.mesh, ctx.i, ctx.sizes, ctx.src, ctx.d = mesh, i, sizes, src, d
        ctx.src_shape = tuple(x.shape)
        send = list(sizes) if me == src else [0] * n
        recv = [0] * n
        recv[src] = sizes[me]
        return _a2a(x.movedim(d, 0), send, recv, mesh, i, "scatter rows").movedim(0, d)

    @staticmethod
    def backward(ctx, g):
        mesh, i, sizes, src, d = ctx.mesh, ctx.i, ctx.sizes, ctx.src, ctx.d
        n, me = mesh.size(i), mesh.get_local_rank(i)
        send = [0] * n
        send[src] = sizes[me]
        recv = list(sizes) if me == src else [0] * n
        out = _a2a(g.movedim(d, 0), send, recv, mesh, i, "scatter gradient rows").movedim(0, d)
        return out.reshape(ctx.src_shape), None, None, None, None, None
