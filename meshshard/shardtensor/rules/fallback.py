"""What an op without a rule of its own gets: run on the local pieces where that is exact.

- Every ShardTensor argument replicated (Partial ones are summed first): the op runs on every
  rank's whole copy; outputs are Replicate with the shapes the op gives on the global shapes
  (worked out on meta tensors). Random ops are refused (the copies would differ per rank).
- One ShardTensor argument, sharded, and an op from :data:`ALONG_DIM` (ops that work along their
  ``dim`` argument only: sort, topk, cummax, median, FFTs, ...) whose ``dim`` avoids the
  sharded dims: local, and the output keeps the input's layout.
- Anything else raises :class:`meshshard.errors.NoShardingRuleError` (``no_rule.NoRuleError``)
  naming the torch function, the aten op and the way out (redistribute), on every rank alike
  (the decision depends on layouts only).
"""

from __future__ import annotations

from typing import Any

import torch

from meshshard.shardtensor._aten import dispatch as _R
from meshshard.shardtensor._aten.dispatch import Plan, _reduced, _replicated, same_layout
from meshshard.shardtensor._aten.no_rule import NoRuleError
from meshshard.shardtensor._aten.registry import FALLBACK, register_rule
from meshshard.shardtensor._aten.tensor import SHARDED, ShardTensor, make_spec

aten = torch.ops.aten

# ops that act along their ``dim`` argument only (each slice along it is independent of the
# others); ``renorm``/``_weight_norm_interface`` are not here: their ``dim`` names the slices
# normalised over the *other* dims
ALONG_DIM = frozenset(getattr(aten, n) for n in (
    "sort", "topk", "kthvalue", "cummax", "cummin", "median", "nanmedian", "mode",
    "logcumsumexp", "cumprod", "glu", "linalg_cross", "_fft_r2c", "_fft_c2r", "_fft_c2c",
    "diff", "_logcumsumexp") if hasattr(aten, n))


def _refuse(func, why: str) -> None:
    raise NoRuleError(func, why=why)


def _dims_of(func, args: tuple, kwargs: dict, ndim: int) -> set | None:
    """The op's ``dim`` argument, normalised (None: the op has none)."""
    for k, a in enumerate(func._schema.arguments):
        if a.name != "dim":
            continue
        if k < len(args):
            v = args[k]
        elif "dim" in kwargs:
            v = kwargs["dim"]
        else:
            v = a.default_value
        if v is None:
            return set(range(ndim))  # e.g. "all dims" defaults
        vals = v if isinstance(v, (list, tuple)) else (v,)
        return {int(d) % max(ndim, 1) for d in vals}
    return None


def _meta(a: Any, spec_of: dict) -> Any:
    if type(a) is ShardTensor:
        return torch.empty(spec_of[id(a)].shape, dtype=a.dtype, device="meta")
    if isinstance(a, torch.Tensor):
        return a.to("meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_meta(b, spec_of) for b in a)
    return a


def generic(func, args: tuple, kwargs: dict) -> Plan:
    if any(isinstance(a, (list, tuple)) and any(type(b) is ShardTensor for b in a)
           for a in (*args, *kwargs.values())) or any(type(v) is ShardTensor
                                                     for v in kwargs.values()):
        _refuse(func, "ShardTensors inside lists or keyword arguments")
    steps: list = []
    specs: dict = {}
    first = None
    for k, a in enumerate(args):
        if type(a) is ShardTensor:
            s, spec = _reduced(a, k)
            steps.extend(s)
            specs[id(a)] = spec
            first = spec if first is None else first
            if not same_layout(spec, first) and not (
                    all(not isinstance(p, SHARDED) for p in spec.placements)
                    and all(not isinstance(p, SHARDED) for p in first.placements)):
                _refuse(func, "operands in different layouts")
    sharded = {first.placements[i].dim for i, p in enumerate(first.placements)
               if isinstance(p, SHARDED)}
    if sharded:
        if func.overloadpacket not in ALONG_DIM:
            _refuse(func, f"an input sharded on dim(s) {sorted(sharded)}")
        if len(specs) != 1 or any(isinstance(a, torch.Tensor) and type(a) is not ShardTensor
                                  for a in args):
            _refuse(func, "a sharded input with other tensor operands")
        dims = _dims_of(func, args, kwargs, len(first.shape))
        if dims is None or dims & sharded:
            _refuse(func, f"over the sharded dim(s) {sorted(sharded)}")
    elif torch.Tag.nondeterministic_seeded in func.tags:
        _refuse(func, "a random op on replicated copies would give each rank other values")
    else:  # Partial inputs of a replicated computation: their reduced, replicated spec
        for a in args:
            if type(a) is ShardTensor:
                specs[id(a)] = _replicated(specs[id(a)])
    out = func(*_meta(args, specs), **{k: _meta(v, specs) for k, v in kwargs.items()})

    def spec_for(o):
        if not isinstance(o, torch.Tensor):
            return None
        if not sharded:
            return make_spec(first.mesh, (_R._REP,) * first.mesh.ndim,
                             (None,) * first.mesh.ndim, tuple(o.shape))
        if o.ndim != len(first.shape) or any(o.shape[d] != first.shape[d] for d in sharded):
            _refuse(func, "its output does not keep the sharded dims")
        return make_spec(first.mesh, first.placements, first.sizes, tuple(o.shape))

    outs = tuple(spec_for(o) for o in out) if isinstance(out, (tuple, list)) else spec_for(out)
    if isinstance(out, list):
        outs = list(outs)
    return Plan(tuple(steps), (), None, outs)


register_rule(FALLBACK)(generic)
