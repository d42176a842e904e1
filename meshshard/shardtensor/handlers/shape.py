"""View and shape ops that keep the sharded dim: view/reshape/flatten/unflatten, permute,
transpose, (un)squeeze, expand, movedim, and chunk/split/unbind along unsharded dims.

A reshape may merge the sharded dim with *inner* dims (rows stay contiguous per rank) or split
it when every rank's size divides; anything that would interleave rows of different ranks
raises and says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.distributed.tensor import Shard

from meshshard.shardtensor._layout import LayoutError, wrap
from meshshard.shardtensor.registry import register_handler
from meshshard.shardtensor.spec import ShardSpec


def _shape_arg(args) -> list[int]:
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return [int(v) for v in args[0]]
    return [int(v) for v in args]


def _resolve(shape: list[int], numel: int) -> list[int]:
    if shape.count(-1) > 1:
        msg = f"only one dimension can be inferred in shape {shape}"
        raise RuntimeError(msg)
    if -1 in shape:
        known = math.prod(v for v in shape if v != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    if math.prod(shape) != numel:
        msg = f"shape {shape} is invalid for a ShardTensor of {numel} elements"
        raise RuntimeError(msg)
    return shape


def _groups(old: Sequence[int], new: Sequence[int]):
    groups = []
    i = j = 0
    while i < len(old) and j < len(new):
        oi, nj = [i], [j]
        po, pn = old[i], new[j]
        i += 1
        j += 1
        while po != pn:
            if po < pn:
                oi.append(i)
                po *= old[i]
                i += 1
            else:
                nj.append(j)
                pn *= new[j]
                j += 1
        groups.append((oi, nj))
    if not groups:
        groups.append(([], []))
    while i < len(old):
        groups[-1][0].append(i)
        i += 1
    while j < len(new):
        groups[-1][1].append(j)
        j += 1
    return groups


def reshape_spec(spec: ShardSpec, new_shape: Sequence[int]) -> ShardSpec:
    """Layout of ``reshape(new_shape)``; raises if rows of different ranks would interleave."""
    old = list(spec.shape)
    new = _resolve(list(new_shape), math.prod(old))
    if 0 in old:
        if any(isinstance(p, Shard) for p in spec.placements):
            msg = "reshape of an empty sharded tensor is not supported"
            raise LayoutError(msg)
    groups = _groups(old, new)
    placements, sizes = list(spec.placements), list(spec.sizes)
    for i, p in enumerate(spec.placements):
        if not isinstance(p, Shard):
            continue
        d = p.dim
        oi, nj = next(g for g in groups if d in g[0])
        before = [k for k in oi if k < d]
        if any(old[k] != 1 for k in before):
            msg = (
                f"reshape {tuple(old)} -> {tuple(new)} merges the sharded dim {d} with outer dims "
                f"{before}: rows of different ranks would interleave. Shard the outer dim, or "
                "permute the sharded dim outward first"
            )
            raise LayoutError(msg)
        inner_old = math.prod(old[k] for k in oi if k > d)
        # a sharded dim of global size 1 (e.g. a batch of 1 over a data axis of 1) maps to the
        # first new dim of its group
        lead = [k for k in nj if new[k] != 1] or ([nj[0]] if old[d] == 1 and nj else [])
        if not lead:
            msg = f"reshape {tuple(old)} -> {tuple(new)} leaves no dim to hold the shards"
            raise LayoutError(msg)
        e = lead[0]
        inner_new = math.prod(new[k] for k in nj if k > e)
        new_sizes = []
        for s in spec.sizes[i]:
            tot = s * inner_old
            if tot % inner_new:
                msg = (
                    f"reshape {tuple(old)} -> {tuple(new)}: a shard of {s} rows along dim {d} "
                    f"cannot be split into rows of {inner_new}; every rank's size must divide"
                )
                raise LayoutError(msg)
            new_sizes.append(tot // inner_new)
        placements[i] = Shard(e)
        sizes[i] = tuple(new_sizes)
    return ShardSpec(spec.mesh, tuple(placements), tuple(sizes), torch.Size(new))


def _reshape_like(method: str):
    def handler(x, *shape):
        new = tuple(_shape_arg(shape))
        spec = x._spec.derived(("reshape", new), lambda: reshape_spec(x._spec, new))
        local = getattr(x._local, method)(spec.local_shape())
        return wrap(local, spec)

    return handler


register_handler(torch.Tensor.view)(_reshape_like("view"))
register_handler(torch.Tensor.reshape)(_reshape_like("reshape"))


@register_handler(torch.reshape)
def _treshape(x, shape):
    return _reshape_like("reshape")(x, shape)


@register_handler(torch.Tensor.view_as, torch.Tensor.reshape_as)
def _view_as(x, other):
    return _reshape_like("reshape")(x, tuple(other.shape))


@register_handler(torch.flatten, torch.Tensor.flatten)
def _flatten(x, start_dim=0, end_dim=-1):
    shape = list(x._spec.shape)
    nd = len(shape)
    if nd == 0:
        return _reshape_like("reshape")(x, (1,))
    s = start_dim + nd if start_dim < 0 else start_dim
    e = end_dim + nd if end_dim < 0 else end_dim
    new = shape[:s] + [math.prod(shape[s : e + 1])] + shape[e + 1 :]
    return _reshape_like("reshape")(x, new)


@register_handler(torch.unflatten, torch.Tensor.unflatten)
def _unflatten(x, dim, sizes):
    shape = list(x._spec.shape)
    d = dim + len(shape) if dim < 0 else dim
    sizes = list(sizes)
    if -1 in sizes:
        known = math.prod(v for v in sizes if v != -1)
        sizes[sizes.index(-1)] = shape[d] // known
    return _reshape_like("reshape")(x, shape[:d] + sizes + shape[d + 1 :])


def _permuted(spec: ShardSpec, perm: Sequence[int]) -> ShardSpec:
    key = ("permute", tuple(perm))
    return spec.derived(key, lambda: _permute_spec(spec, key[1]))


def _permute_spec(spec: ShardSpec, perm: Sequence[int]) -> ShardSpec:
    placements = tuple(
        Shard(list(perm).index(p.dim)) if isinstance(p, Shard) else p for p in spec.placements
    )
    shape = torch.Size([spec.shape[k] for k in perm])
    return ShardSpec(spec.mesh, placements, spec.sizes, shape)


@register_handler(torch.permute, torch.Tensor.permute)
def _permute(x, *dims):
    nd = x._spec.ndim
    perm = [d + nd if d < 0 else d for d in _shape_arg(dims)]
    return wrap(x._local.permute(perm), _permuted(x._spec, perm))


@register_handler(
    torch.transpose, torch.Tensor.transpose, torch.swapaxes, torch.Tensor.swapaxes,
    torch.swapdims, torch.Tensor.swapdims,
)
def _transpose(x, d0, d1):
    nd = x._spec.ndim
    d0, d1 = (d + nd if d < 0 else d for d in (d0, d1))
    perm = list(range(nd))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return wrap(x._local.transpose(d0, d1), _permuted(x._spec, perm))


@register_handler(torch.t, torch.Tensor.t)
def _t(x):
    if x._spec.ndim < 2:
        return x
    return _transpose(x, 0, 1)


@register_handler(torch.Tensor.mT.__get__)
def _mT(x):
    return _transpose(x, -2, -1)


@register_handler(torch.movedim, torch.Tensor.movedim, torch.moveaxis, torch.Tensor.moveaxis)
def _movedim(x, source, destination):
    nd = x._spec.ndim
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src = [s + nd if s < 0 else s for s in src]
    dst = [d + nd if d < 0 else d for d in dst]
    perm = [None] * nd
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(k for k in range(nd) if k not in src)
    perm = [p if p is not None else next(rest) for p in perm]
    return wrap(x._local.permute(perm), _permuted(x._spec, perm))


@register_handler(torch.squeeze, torch.Tensor.squeeze)
def _squeeze(x, dim=None):
    spec = x._spec
    nd = spec.ndim
    if dim is None:
        dims = [d for d in range(nd) if spec.shape[d] == 1]
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        dims = [d + nd if d < 0 else d for d in dims]
        dims = [d for d in dims if spec.shape[d] == 1]
    for p in spec.placements:
        if isinstance(p, Shard) and p.dim in dims:
            msg = f"squeeze of the sharded dim {p.dim} (global size 1) is not supported"
            raise LayoutError(msg)
    local = x._local.squeeze(tuple(dims)) if dims else x._local
    placements = tuple(
        Shard(p.dim - sum(1 for d in dims if d < p.dim)) if isinstance(p, Shard) else p
        for p in spec.placements
    )
    shape = torch.Size([s for d, s in enumerate(spec.shape) if d not in dims])
    return wrap(local, ShardSpec(spec.mesh, placements, spec.sizes, shape))


@register_handler(torch.unsqueeze, torch.Tensor.unsqueeze)
def _unsqueeze(x, dim):
    spec = x._spec
    nd = spec.ndim + 1
    d = dim + nd if dim < 0 else dim
    placements = tuple(
        Shard(p.dim + 1 if p.dim >= d else p.dim) if isinstance(p, Shard) else p
        for p in spec.placements
    )
    shape = list(spec.shape)
    shape.insert(d, 1)
    return wrap(x._local.unsqueeze(d), ShardSpec(spec.mesh, placements, spec.sizes,
                                                 torch.Size(shape)))


@register_handler(torch.Tensor.expand)
def _expand(x, *sizes):
    spec = x._spec
    new = _shape_arg(sizes)
    k = len(new) - spec.ndim
    shape = [spec.shape[d - k] if v == -1 else v for d, v in enumerate(new)]
    local_shape = list(shape)
    placements = []
    for i, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            od = p.dim + k
            if shape[od] != spec.shape[p.dim]:
                msg = f"expand would change the size of the sharded dim {p.dim}"
                raise LayoutError(msg)
            local_shape[od] = spec.sizes[i][spec.coordinate()[i]]
            placements.append(Shard(od))
        else:
            placements.append(p)
    return wrap(x._local.expand(local_shape),
                ShardSpec(spec.mesh, tuple(placements), spec.sizes, torch.Size(shape)))


@register_handler(torch.Tensor.expand_as)
def _expand_as(x, other):
    return _expand(x, tuple(other.shape))


def _along_unsharded(fn, name):
    def handler(x, arg, dim=0):
        spec = x._spec
        d = dim + spec.ndim if dim < 0 else dim
        if spec.mesh_dim_of(d) is not None:
            msg = (
                f"{name} along the sharded dim {d} is not supported; slice it with indexing "
                "(x[a:b] keeps each rank's rows) or redistribute"
            )
            raise LayoutError(msg)
        outs = fn(x._local, arg, d)
        res = []
        for o in outs:
            shape = list(spec.shape)
            shape[d] = o.shape[d]
            res.append(wrap(o, spec.with_changes(shape=torch.Size(shape))))
        return tuple(res)

    return handler


register_handler(torch.chunk, torch.Tensor.chunk)(
    _along_unsharded(lambda t, n, d: torch.chunk(t, n, d), "chunk")
)
register_handler(torch.split, torch.Tensor.split)(
    _along_unsharded(lambda t, s, d: torch.split(t, s, d), "split")
)


@register_handler(torch.unbind, torch.Tensor.unbind)
def _unbind(x, dim=0):
    spec = x._spec
    d = dim + spec.ndim if dim < 0 else dim
    if spec.mesh_dim_of(d) is not None:
        msg = f"unbind along the sharded dim {d} is not supported"
        raise LayoutError(msg)
    outs = torch.unbind(x._local, d)
    placements = tuple(
        Shard(p.dim - 1 if p.dim > d else p.dim) if isinstance(p, Shard) else p
        for p in spec.placements
    )
    shape = torch.Size([s for k, s in enumerate(spec.shape) if k != d])
    return tuple(wrap(o, ShardSpec(spec.mesh, placements, spec.sizes, shape)) for o in outs)
