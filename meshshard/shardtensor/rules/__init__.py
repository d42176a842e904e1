"""What a rule author needs: :func:`register_rule`, the :class:`Plan` a rule returns, and the
helpers for layouts and collectives over one mesh dim.

A ShardTensor op reaches its rule at the aten level (below autograd, forward and backward
alike) as ``rule(func, args, kwargs)``; ``args`` hold ShardTensors whose layout
(:func:`spec_of`: mesh, placements, every rank's sizes, global shape) the rule reads. It returns
a :class:`Plan`: which layout conversions the local pieces need first (``steps``), the local
computation (``call``, given the local pieces; the op itself when None) and the output layout
(``outs``). Plans are cached per input layout, so a rule runs once per layer shape. The worked
example (``topk`` along the sharded dim) is in ``docs/design/core.md``.

Rules must be exact (the same values as one process on the gathered data, on uneven layouts
and empty shards), keep their collectives inside ``call`` (functional collectives, so they trace
under ``torch.compile``), and let autograd differentiate: a backward aten op needs a rule too.

The package's modules hold meshshard's own rules, one per op family: :mod:`.pointwise`,
:mod:`.values`, :mod:`.reduction`, :mod:`.norm`, :mod:`.shape`, :mod:`.view`, :mod:`.slice`,
:mod:`.index`, :mod:`.linalg`, :mod:`.tp`, :mod:`.attention`, :mod:`.grid_conv`,
:mod:`.grid_window`, :mod:`.grid_circular`, :mod:`.grid_norm`, :mod:`.grid_resample`,
:mod:`.graph_rows`, :mod:`.graph_scatter` and :mod:`.fallback`; ``import meshshard.shardtensor``
registers them all.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import Replicate

from meshshard.shardtensor._aten.collective_ops import fc as _fc
from meshshard.shardtensor._aten.dispatch import Plan, _all_gather_v
from meshshard.shardtensor._aten.meshinfo import check as _check
from meshshard.shardtensor._aten.meshinfo import coord as _coord
from meshshard.shardtensor._aten.registry import (
    FALLBACK,
    POINTWISE,
    POINTWISE_INPLACE,
    Rule,
    RuleConflictError,
    register_rule,
    registered_rules,
    rule_for,
)
from meshshard.shardtensor._aten.tensor import SHARDED, ASpec, ShardTensor, make_spec

__all__ = ["FALLBACK", "POINTWISE", "POINTWISE_INPLACE", "Plan", "Rule", "RuleConflictError",
           "all_gather", "all_reduce", "make_spec", "mesh_rank", "register_rule",
           "registered_rules", "rule_for", "shard_offset", "sharded_mesh_dims", "spec_of",
           "with_dim_replicated"]


def spec_of(x: ShardTensor) -> ASpec:
    """The layout of ``x``: ``.mesh``, ``.placements``, ``.sizes`` (per mesh dim, every rank's
    size of its sharded dim, or None) and ``.shape`` (global)."""
    return x._spec


def sharded_mesh_dims(spec: ASpec, dim: int) -> list[int]:
    """The mesh dims along which tensor dim ``dim`` is sharded."""
    return [i for i, p in enumerate(spec.placements) if isinstance(p, SHARDED) and p.dim == dim]


def mesh_rank(mesh: Any, i: int) -> int:
    """This rank's coordinate along mesh dim ``i``."""
    return _coord(mesh)[1][i]


def shard_offset(spec: ASpec, i: int) -> int:
    """The global index of this rank's first row along the dim sharded on mesh dim ``i``."""
    return sum(spec.sizes[i][: mesh_rank(spec.mesh, i)])


def with_dim_replicated(spec: ASpec, dim: int, size: int) -> ASpec:
    """``spec`` with tensor dim ``dim`` of global extent ``size`` and Replicate on every mesh
    dim that sharded it (the output layout of an op that gathers that dim)."""
    over = set(sharded_mesh_dims(spec, dim))
    placements = tuple(Replicate() if i in over else p for i, p in enumerate(spec.placements))
    sizes = tuple(None if i in over else s for i, s in enumerate(spec.sizes))
    shape = list(spec.shape)
    shape[dim] = size
    return make_spec(spec.mesh, placements, sizes, tuple(shape))


def all_reduce(t: torch.Tensor, mesh: Any, i: int, op: str = "sum") -> torch.Tensor:
    """All-reduce a local tensor over mesh dim ``i`` (``op``: "sum", "max", "min").
    Collective: every rank of that mesh dim must call it (inside a Plan's ``call``)."""
    if mesh.size(i) == 1:
        return t
    _check("all_reduce", mesh, i, t, op)
    return _fc.wait_tensor(_fc.all_reduce(t.contiguous(), op, _coord(mesh)[2][i]))


def all_gather(t: torch.Tensor, dim: int, sizes: tuple, mesh: Any, i: int) -> torch.Tensor:
    """Concatenate every rank's ``t`` along ``dim`` over mesh dim ``i``; ``sizes``: every rank's
    extent along ``dim`` (uneven and zero sizes are fine). Collective, like :func:`all_reduce`."""
    return _all_gather_v(t, dim, tuple(sizes), mesh, i)
