"""Layout errors and the layout helpers every sharding rule shares: wrapping local results,
checking meshes, reducing Partial operands, aligning shard sizes and cutting replicated operands
to the local rows."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.errors import LayoutError as _LayoutError
from meshshard.shardtensor import collectives as C
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.spec import ShardSpec, intern_spec, mesh_group

log = logging.getLogger(__name__)

__all__ = [
    "LayoutError",
    "align_sizes",
    "check_same_mesh",
    "reduce_partials",
    "replicated_local",
    "wrap",
    "wrap_outputs",
]


class LayoutError(_LayoutError):
    """Operands are laid out incompatibly (different meshes or different shard sizes)."""


def wrap(local: torch.Tensor, spec: ShardSpec) -> ShardTensor:
    return ShardTensor(local, spec)


def check_same_mesh(sts: Sequence[ShardTensor]) -> Any:
    mesh = sts[0]._spec.mesh
    for t in sts[1:]:
        m = t._spec.mesh
        if m is not mesh and m != mesh:
            msg = (
                f"ShardTensors live on different DeviceMeshes ({mesh} and {m}); move one with "
                "from_local(t.full_tensor(), mesh, ...) or build both on the same mesh"
            )
            raise LayoutError(msg)
    return mesh


def reduce_partials(st: ShardTensor, mesh_dims: Sequence[int] | None = None) -> ShardTensor:
    """All-reduce Partial placements (on ``mesh_dims`` or all) -> Replicate (differentiable)."""
    spec = st._spec
    if not spec.has_partial():
        return st
    key = None if mesh_dims is None else tuple(sorted(mesh_dims))
    cache = st.__dict__.setdefault("_reduced_cache", {})
    if key in cache:
        return cache[key]
    local = st._local
    placements = list(spec.placements)
    for i, p in enumerate(spec.placements):
        if isinstance(p, Partial) and (mesh_dims is None or i in mesh_dims):
            local = C.all_reduce(local, p.reduce_op, mesh_group(spec.mesh, i))
            placements[i] = Replicate()
    if placements == list(spec.placements):
        return st
    out = wrap(local, intern_spec(spec.with_changes(placements=tuple(placements))))
    cache[key] = out  # one reduction per Partial tensor, however many consumers it has
    return out


def align_sizes(t: ShardTensor, operands: Sequence[Any], out_ndim: int) -> ShardTensor:
    """Redistribute ``t`` to the shard sizes of the first operand that shards the same
    (broadcast-aligned) dim on the same mesh dim, when they differ. Rows move only between the
    ranks whose ranges differ (uneven all-to-all); differentiable; collective."""
    spec = t._spec
    target = list(spec.sizes)
    changed = False
    for i, p in enumerate(spec.placements):
        if not isinstance(p, Shard):
            continue
        d = p.dim + out_ndim - spec.ndim
        for o in operands:
            if not isinstance(o, ShardTensor):
                continue
            q = o._spec.placements[i]
            if isinstance(q, Shard) and q.dim + out_ndim - o._spec.ndim == d:
                if o._spec.sizes[i] != spec.sizes[i] and sum(o._spec.sizes[i]) == sum(
                    spec.sizes[i]
                ):
                    target[i] = o._spec.sizes[i]
                    changed = True
                break
    if not changed:
        return t
    log.debug("redistributing %s to sizes %s to match another operand", spec.describe(), target)
    return t.redistribute(spec.placements, target)


def replicated_local(
    t: Any, spec_out: ShardSpec, aligned_dims: dict[int, int] | None = None
) -> torch.Tensor:
    """Local piece of a replicated operand (plain tensor or all-Replicate ShardTensor) for an op
    whose output has ``spec_out``.

    ``aligned_dims`` maps mesh dim -> this operand's dim that lines up with the output's
    sharded dim (if it has full size there, its local rows are cut out); for every other
    non-replicated output mesh dim, the gradient is summed over that mesh dim in backward.
    """
    local = t._local if isinstance(t, ShardTensor) else t
    if not isinstance(local, torch.Tensor):
        return local
    mesh = spec_out.mesh
    groups = []
    for i, p in enumerate(spec_out.placements):
        if isinstance(p, Replicate):
            continue
        d = None if aligned_dims is None else aligned_dims.get(i)
        if isinstance(p, Shard) and d is not None and local.shape[d] != 1:
            local = C.split_local(local, d, spec_out.sizes[i], mesh_group(mesh, i))
        else:
            groups.append(mesh_group(mesh, i))
    if groups:
        local = C.grad_all_reduce(local, groups)
    return local


def wrap_outputs(out: Any, spec_of: Callable[[torch.Tensor], ShardSpec]) -> Any:
    if isinstance(out, torch.Tensor):
        return wrap(out, spec_of(out))
    if isinstance(out, (tuple, list)):
        vals = [wrap_outputs(o, spec_of) for o in out]
        if hasattr(out, "_fields") or type(out).__name__.startswith("torch.return_types"):
            return type(out)(vals)
        try:
            return type(out)(vals)
        except TypeError:
            return tuple(vals)
    return out
