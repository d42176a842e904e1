"""One collective for the weight gradients of a backward.

A plain weight used with ShardTensors gets a Partial gradient (each rank's sum over its own
points), which must be summed over the ranks. Done where it appears (a lifted weight's
backward, a fused linear's ``dW + db``), that is one all-reduce per layer: 23 of the 27
collectives of the reference Transolver's step at 1k points, and on gloo each costs a fixed
~0.3 ms of CPU whatever its size, which was most of the step's overhead at small sizes.

An autograd node must return its input's final gradient when the engine calls it, so a
per-node backward cannot wait for the others. But every engine call on ShardTensors goes
through ``ShardTensor``'s entries (``backward``, ``autograd.grad``; also AOTAutograd's one
``torch.autograd.grad(outs, primals)`` while ``torch.compile`` traces the joint graph). Such a
call opens a bucket here for its plain leaf weights; inside it a weight's node hands its
Partial piece to the bucket and returns nothing for the weight; when the engine is done, the
bucket sums all the pieces in one flattened collective per (mesh, dtype, mesh dims). For
``autograd.grad`` (eager or traced) each sum is added to the result returned for that weight;
for ``backward`` it is added to the weight's ``.grad`` (a fresh tensor laid out like the
weight, or in place into the ``.grad`` there is), after what the engine accumulated itself.
So a step's backward holds one weight-gradient collective instead of one per layer.

``backward`` defers only inside :func:`bucket_weight_grads` (opt in): frameworks that read a
weight's ``.grad`` during the backward or hook its AccumulateGrad node (DDP's reducer,
FSDP2's post-backward) would see it too late, and such hooks are not visible from Python.
``autograd.grad`` defers always (its results are returned, no AccumulateGrad runs).

Not deferred, so as before: ``create_graph`` (the sum must be differentiable),
``backward(inputs=...)``, a weight with a tensor hook or a post-accumulate-grad hook (the
hook must see the summed gradient when its node returns), a tensor that is not a root of the
graph, a call while Dynamo traces user code (only the joint graph is bucketed). A nested
engine call (``backward`` inside a backward) opens an empty bucket, so nothing defers into an
outer call's results. The open buckets are one stack per process, not per thread: the engine
may run a backward's nodes on a device thread while the caller waits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["bucket_weight_grads", "collecting", "defer", "eager_backward", "finish", "takes"]

# buckets of the engine calls now running, innermost last (None: this call does not defer)
_OPEN: list = []
_EAGER_BACKWARD = [False]  # set by bucket_weight_grads


@contextmanager
def bucket_weight_grads(enabled: bool = True) -> Iterator[None]:
    """Inside: ``backward()`` on ShardTensors sums the plain weights' gradients over the ranks
    in one collective per (mesh, dtype) after the engine is done, not one per layer, and adds
    them to ``.grad`` (the same values; 25 -> 5 backward all-reduces for a 2-layer Transolver).

    Use it where nothing reads a weight's ``.grad`` before the backward returns: not with
    ``DistributedDataParallel`` or FSDP (their reducers hook each weight's gradient
    accumulation, which no longer runs for a deferred weight), nor with a hook registered on
    a gradient-accumulator node. Tensor hooks (``register_hook``) and post-accumulate-grad
    hooks are seen: those weights keep the per-layer sum. ``torch.autograd.grad`` and the
    backward of a ``torch.compile``'d model bucket without it.

    Examples
    --------
    >>> from meshshard.shardtensor import bucket_weight_grads
    >>> with bucket_weight_grads():  # doctest: +SKIP
    ...     loss.backward()
    """
    prev = _EAGER_BACKWARD[0]
    _EAGER_BACKWARD[0] = bool(enabled)
    try:
        yield
    finally:
        _EAGER_BACKWARD[0] = prev


def eager_backward() -> bool:
    """Whether ``backward()`` buckets now (inside :func:`bucket_weight_grads`)."""
    return _EAGER_BACKWARD[0]


class _Bucket:
    def __init__(self, inputs: Sequence[Any]) -> None:
        self.index: dict = {}  # id -> the first position of that tensor among the inputs
        self.same: dict = {}  # first position -> later positions of the same tensor
        for k, t in enumerate(inputs):
            if not _root(t):
                continue
            if id(t) in self.index:
                self.same.setdefault(self.index[id(t)], []).append(k)
            else:
                self.index[id(t)] = k
        self.parts: list = []


def _root(t: Any) -> bool:
    """Nothing upstream of ``t`` (its gradient goes nowhere else): a leaf, or what AOTAutograd
    makes of a graph input (a node with no inputs of its own)."""
    if not isinstance(t, torch.Tensor) or t._backward_hooks:
        return False  # (a tensor hook must see the summed gradient: per-node sum for it)
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
    for k, later in b.same.items():  # a tensor passed twice gets its gradient twice
        for j in later:
            out[j] = out[k]
    return tuple(out)
