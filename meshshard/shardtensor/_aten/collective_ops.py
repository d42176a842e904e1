"""The collectives of the ShardTensor rules: torch's functional collectives in eager, and
under ``torch.compile`` the same calls as ``meshshard::`` custom ops that every rank traces
alike, whatever its piece.

Under tracing two things made ranks' graphs diverge where one rank's piece is empty (dynamo
specialises it to 0 rows, so its partial sums are constants):

- common-subexpression elimination merged two collectives on equal constant inputs, on that
  rank only (one all-reduce fewer there). Each traced collective here carries its call number
  (``seq``), so no two are equal;
- the partitioner moved tangent-independent backward collectives into the forward, on that rank
  only. :func:`pinned_to_pass` keeps each in the pass it was traced in;
- inductor's scheduler reordered them, on that rank only: a collective on a constant input
  has no data dependency on the collective before it, and the effect tokens below do not
  order anything in inductor 2.13 (``with_effects``' lowering files its ordering dependencies
  under the buffer's name, the scheduler looks them up under the operation's name, so they are
  never applied). So the empty rank ran block 2's all-reduce before block 1's second one
  (gloo: "128 vs 16 bytes"). Each traced collective therefore also takes the previous one's
  output (``after``) as an input it does not read: a data dependency that every pass keeps.

Each op waits for its result (gloo and NCCL alike); the graph runs them in trace order.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from meshshard.shardtensor._aten._torch_private import (
    in_checkpointed_region,
    keep_saved,
    pinned_to_pass,
    register_ordered_effect,
    traced_region,
    tracing_a_joint_graph,
)

__all__ = ["fc", "keep_checkpointed_collectives_saved"]

_c10d = torch.ops._c10d_functional


@torch.library.custom_op("meshshard::all_reduce", mutates_args=())
def _all_reduce(t: torch.Tensor, op: str, group: str, seq: int,
                after: torch.Tensor | None = None) -> torch.Tensor:
    return _c10d.wait_tensor(_c10d.all_reduce(t, op, group))


@_all_reduce.register_fake
def _(t, op, group, seq, after=None):
    return t.new_empty(t.shape)


@torch.library.custom_op("meshshard::all_gather_into_tensor", mutates_args=())
def _all_gather(t: torch.Tensor, n: int, group: str, seq: int,
                after: torch.Tensor | None = None) -> torch.Tensor:
    return _c10d.wait_tensor(_c10d.all_gather_into_tensor(t, n, group))


@_all_gather.register_fake
def _(t, n, group, seq, after=None):
    return t.new_empty((n * t.shape[0], *t.shape[1:]))


@torch.library.custom_op("meshshard::all_to_all_single", mutates_args=())
def _all_to_all(t: torch.Tensor, out_splits: list[int], in_splits: list[int], group: str,
                seq: int, after: torch.Tensor | None = None) -> torch.Tensor:
    return _c10d.wait_tensor(_c10d.all_to_all_single(t, out_splits, in_splits, group))


@_all_to_all.register_fake
def _(t, out_splits, in_splits, group, seq, after=None):
    return t.new_empty((sum(out_splits), *t.shape[1:]))


for _op in ("meshshard::all_reduce", "meshshard::all_gather_into_tensor",
            "meshshard::all_to_all_single"):
    # ordered: compile passes neither reorder, merge nor drop them (an effect token chain)
    register_ordered_effect(_op)


class _Collectives:
    """``torch.ops._c10d_functional``'s all_reduce, all_gather_into_tensor, all_to_all_single
    and wait_tensor, as the rules call them."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        # per graph being traced, per pass (forward, backward): the last collective's output
        self._last: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _traced(self, op: Any, *args: Any) -> torch.Tensor:
        keep_checkpointed_collectives_saved()
        region = traced_region()
        chain = None if region is None else self._last.setdefault(region[0], {})
        after = None if chain is None else chain.get(region[1])
        ac = region is not None and in_checkpointed_region()
        before = len(region[0].nodes) if ac else 0
        with pinned_to_pass():
            out = op(*args, next(self._seq), after)
        if chain is not None:
            chain[region[1]] = out
        if ac:  # tagged must-save once the region's mode has tagged them (see keep_saved)
            new = itertools.islice(reversed(region[0].nodes), len(region[0].nodes) - before)
            _AC_PENDING.extend(n for n in new if n.op == "call_function")
        return out

    def all_reduce(self, t: torch.Tensor, op: str, group: str) -> torch.Tensor:
        if tracing_a_joint_graph():
            return self._traced(torch.ops.meshshard.all_reduce, t, op, group)
        return _c10d.all_reduce(t, op, group)

    def all_gather_into_tensor(self, t: torch.Tensor, n: int, group: str) -> torch.Tensor:
        if tracing_a_joint_graph():
            return self._traced(torch.ops.meshshard.all_gather_into_tensor, t, n, group)
        return _c10d.all_gather_into_tensor(t, n, group)

    def all_to_all_single(self, t: torch.Tensor, out_splits: list, in_splits: list,
                          group: str) -> torch.Tensor:
        if tracing_a_joint_graph():
            return self._traced(torch.ops.meshshard.all_to_all_single, t, list(out_splits),
                                list(in_splits), group)
        return _c10d.all_to_all_single(t, out_splits, in_splits, group)

    @staticmethod
    def wait_tensor(t: torch.Tensor) -> torch.Tensor:
        # a traced collective above has already waited (inside its custom op)
        return t if tracing_a_joint_graph() else _c10d.wait_tensor(t)


fc = _Collectives()

# collectives traced in an activation-checkpointed region, not yet marked must-save
_AC_PENDING: list = []


def keep_checkpointed_collectives_saved() -> None:
    """Mark the collectives traced so far in checkpointed regions must-save (a no-op in
    eager: nothing is pending). Called before each op on a ShardTensor and each traced
    collective, and when the backward is traced."""
    if _AC_PENDING:
        keep_saved(_AC_PENDING)
        _AC_PENDING.clear()

