"""One collective for the weight gradients of a traced backward (issue 22: the 5 ms target).

A plain weight used with ShardTensors gets a Partial gradient (each rank's sum over its own
points), which must be summed over the ranks. Done where it appears (a lifted weight's
backward, a fused linear's ``dW + db``), that is one all-reduce per layer: 23 of the 27
collectives of the reference Transolver's step at 1k points, and on gloo each costs a fixed
~0.3 ms of CPU whatever its size, which was most of the compiled step's overhead.

An autograd node must return its input's final gradient when the engine calls it, so a
per-node backward cannot wait for the others. But while ``torch.compile`` traces the joint
graph, AOTAutograd asks for the weights' gradients with one ``torch.autograd.grad(outs,
primals)`` call, which reaches ``ShardTensor``'s entry (the outputs are ShardTensors). Inside
that call a weight's node hands its Partial piece to the bucket opened here and returns
nothing for the weight; when the engine is done, the bucket sums all the pieces in one
flattened collective per (mesh, dtype, mesh dims) and adds each to the result the call
returns for that weight. The traced backward graph then holds one weight-gradient
collective instead of one per layer, and every returned gradient is the global one.

Only while a joint graph is traced and not ``create_graph``, and only for the call's own plain
leaf inputs: eager ``backward()`` accumulates each weight's ``.grad`` as soon as its node
returns, and tensor hooks see the value then, so eager keeps the per-node sums. A nested
engine call (``backward`` inside a backward) opens an empty bucket, so nothing defers into an
outer call's results. The open buckets are one stack per process, not per thread: the engine
may run a traced backward's nodes on a device thread, and tracing is single-threaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["collecting", "defer", "finish", "takes"]

# buckets of the engine calls now running, innermost last (None: this call does not defer)
_OPEN: list = []


class _Bucket:
    def __init__(self, inputs: Sequence[Any]) -> None:
        self.index = {id(t): k for k, t in enumerate(inputs) if _root(t)}
        self.parts: list = []


def _root(t: Any) -> bool:
    """Nothing upstream of ``t`` (its gradient goes nowhere else): a leaf, or what AOTAutograd
    makes of a graph input (a node with no inputs of its own)."""
    if not isinstance(t, torch.Tensor):
        return False
    return t.is_leaf or not t.grad_fn.next_functions


def defer(src_id: int, local: torch.Tensor, key: tuple) -> bool:
    """Hand ``local``, the Partial piece of the gradient of the plain tensor whose ``id`` is
    ``src_id``, to the open bucket; True if taken (the caller then returns None for it).
    ``key`` is (mesh, dtype, mesh dims to sum over)."""
    if not _OPEN or _OPEN[-1] is None:
        return False
    b = _OPEN[-1]
    k = b.index.get(src_id)
    if k is None:
        return False
    b.parts.append((k, local, key))
    return True


def takes(src_id: int) -> bool:
    """Whether the open bucket would take a piece for the plain tensor ``id`` ``src_id``."""
    return bool(_OPEN) and _OPEN[-1] is not None and src_id in _OPEN[-1].index


@contextmanager
def collecting(inputs: Sequence[Any] | None, enabled: bool) -> Iterator[Any]:
    """While the engine runs inside: a bucket for the weight gradients of ``inputs`` (the
    plain ones; None for the others) if ``enabled``, else none (nested calls never defer into
    an outer one)."""
    b = _Bucket(inputs) if enabled and inputs else None
    _OPEN.append(b)
    try:
        yield b
    finally:
        _OPEN.pop()


def finish(b: Any, results: Sequence[Any], reduce: Callable[[list, Any, Any], list]) -> tuple:
    """``results`` (one per input of the engine call) with the bucket's pieces summed over
    the ranks, ``reduce(pieces, mesh, dims)`` being one flattened collective per dim, and
    added in. Same order on every rank: the pieces are grouped in order of first arrival."""
    out = list(results)
    if b is None or not b.parts:
        return tuple(out)
    groups: dict = {}
    for k, local, key in b.parts:
        per = groups.setdefault(key, {})
        per[k] = local if k not in per else per[k] + local
    for (mesh, _, dims), per in groups.items():
        ks = list(per)
        for k, t in zip(ks, reduce([per[k] for k in ks], mesh, dims)):
            out[k] = t if out[k] is None else out[k] + t
    return tuple(out)
