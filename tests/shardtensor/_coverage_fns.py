"""Which registered rules the oracle cases reach on an uneven layout: the op-family oracles
(:mod:`tests.shardtensor._cases`, :mod:`tests.shardtensor._grid_cases`,
:mod:`tests.shardtensor._rule_cases`) run under modes that record every aten op and torch
function called with a ShardTensor sharded unevenly."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


def op_key(op) -> str:
    """The coverage table's name of a registered op (aten op, torch function or slot)."""
    if isinstance(op, str):
        return op
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(op)
    mod = getattr(op, "__module__", None) or ""
    return f"{mod}.{op.__qualname__}" if mod else op.__qualname__


def _uneven(args, kwargs) -> bool:
    from meshshard.shardtensor import ShardTensor

    def walk(a):
        if type(a) is ShardTensor:
            return any(s is not None and len(set(s)) > 1 for s in a._spec.sizes)
        if isinstance(a, (list, tuple)):
            return any(walk(b) for b in a)
        return False

    return walk(args) or walk(tuple((kwargs or {}).values()))


class _Recorder:
    """Adds to ``seen`` every function called with an unevenly sharded ShardTensor."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def _record(self, func, args, kwargs):
        if _uneven(args, kwargs):
            self.seen.add(func)
        return func(*args, **(kwargs or {}))


class _Functions(_Recorder, TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self._record(func, args, kwargs)


class _Aten(_Recorder, TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._record(func, args, kwargs)


def reached_ops(rank, world_size, sizes):
    """Rank function: run the op-family oracles under the recorders; return (names of the
    registered rules reached, failures of the cases)."""
    from meshshard.shardtensor._aten import dispatch as _R
    from meshshard.shardtensor._aten.registry import (
        FALLBACK,
        POINTWISE,
        POINTWISE_INPLACE,
        registered_rules,
    )
    from tests.shardtensor._cases import run_cases
    from tests.shardtensor._grid_cases import run_grid_cases
    from tests.shardtensor._rule_cases import all_cases

    seen: set = set()
    with _Functions(seen), _Aten(seen):
        res = run_cases(rank, world_size, sizes)
        res.update(run_grid_cases(rank, world_size, (world_size,), (sizes,)))
        all_cases(rank, world_size, [sizes])  # (compared with one process by test_<family>)
    rules = registered_rules()
    reached = set()
    slot_fns = {s: rules[s].fn for s in (POINTWISE, POINTWISE_INPLACE, FALLBACK)}
    for f in seen:
        if f in rules:
            reached.add(op_key(f))
        elif isinstance(f, torch._ops.OpOverload):
            if f.overloadpacket in rules:
                reached.add(op_key(f.overloadpacket))
            else:  # served by a slot
                fn = _R._RESOLVED.get(f)
                reached.update(s for s, sf in slot_fns.items() if sf is fn)
    failed = {k: v for k, v in res.items() if v not in (None, "n/a")}
    return sorted(reached), failed
