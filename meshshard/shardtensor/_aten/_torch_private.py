"""The private torch names the core relies on, in one place (checked by a test).

``torch.autograd.backward`` and ``torch.autograd.grad`` hand ShardTensor arguments to
``__torch_function__``; if the handler ran them with torch-function handling disabled (the
default), the whole backward pass would too, and recomputations inside it (reentrant
checkpointing) would skip the lift of plain weights. So the handler runs the engine itself,
exactly as those two functions do, with handling on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
from torch.autograd.graph import _engine_run_backward

__all__ = ["NAMES", "definitely_less", "in_checkpointed_region", "is_contiguous_or_false",
           "is_custom_op_autograd_function", "keep_saved", "pinned_to_pass",
           "register_ordered_effect", "run_backward", "run_grad", "skip_dynamo_frame",
           "traced_region", "tracing_a_joint_graph"]

NAMES = (
    "torch.autograd._make_grads",
    "torch.autograd._tensor_or_tensors_to_tuple",
    "torch.autograd.graph._engine_run_backward",
    "torch._dynamo.eval_frame.skip_code",
    "torch.fx.experimental.symbolic_shapes.guard_or_false",
    "torch._prims_common.is_contiguous_or_false",
    "torch.fx.traceback.current_meta",
    "torch.fx.traceback.has_preserved_node_meta",
    "torch._functorch.partitioners._has_tag_must_be_in_backward",
    "torch.fx.experimental.proxy_tensor.get_proxy_mode",
    "torch.library._register_effectful_op",
    "torch._library.effects.EffectType",
    "torch._library.autograd.make_autograd_impl",
)


def tracing_a_joint_graph() -> bool:
    """True while FX (AOTAutograd) records nodes with their metadata, i.e. while a graph for
    ``torch.compile`` is being traced; False in eager."""
    from torch.fx import traceback as fxt

    return fxt.has_preserved_node_meta()


@contextmanager
def pinned_to_pass() -> Iterator[None]:
    """Nodes recorded inside stay in the pass (forward or backward) they are traced in.

    AOTAutograd's min-cut partitioner moves a backward node whose value does not depend on the
    incoming gradient into the forward graph. A rank whose piece is empty (dynamo specialises
    it to 0 rows) has weight-gradient partial sums that are constant zeros, so *its* backward
    all-reduces moved into *its* forward while its peers kept theirs in the backward, and the
    ranks ran their collectives in different orders (gloo: "512 vs 32 bytes ... collective
    mismatch"). The partitioner keeps a node tagged ``must_be_in_backward`` in the backward and
    one tagged ``must_be_in_forward`` in the forward."""
    from torch.fx import traceback as fxt

    meta = fxt.current_meta
    old = meta.get("partitioner_tag")
    meta["partitioner_tag"] = ("must_be_in_backward" if old == "is_backward"
                               else "must_be_in_forward")
    try:
        yield
    finally:
        meta["partitioner_tag"] = old


def in_checkpointed_region() -> bool:
    """True while an activation-checkpointed region is traced (``torch.utils.checkpoint``
    under compile: its dispatch mode tags each node ``ac_graph_id`` and ``recompute``)."""
    from torch.fx import traceback as fxt

    return "ac_graph_id" in fxt.current_meta


def keep_saved(nodes: list) -> None:
    """Mark traced nodes must-save, so the partitioner never recomputes them in the backward.

    For collectives in a checkpointed region: they are effectful ops, and recomputing one in
    the backward replays its effect token, which AOTAutograd then saves for the backward as
    ``None`` ("expected all tensors_saved_with_vc_check to be Tensors"). The region's dispatch
    mode tags every node an op creates *after* the op returns (overwriting the tag), so this
    runs later: at the next op on a ShardTensor, or when the backward is traced."""
    from torch.utils.checkpoint import CheckpointPolicy

    for n in nodes:
        n.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def register_ordered_effect(qualname: str) -> None:
    """Register the custom op ``qualname`` as an ORDERED effectful op: AOTAutograd threads an
    effect token through it, so no compile pass drops or merges it."""
    from torch._library.effects import EffectType

    torch.library._register_effectful_op(qualname, EffectType.ORDERED)


def is_custom_op_autograd_function(owner: Any) -> bool:
    """Whether ``owner`` is the ``autograd.Function`` class that ``torch.library.custom_op``
    builds for an op with a registered autograd formula (in ``torch._library.autograd``)."""
    return isinstance(owner, type) and owner.__module__ == "torch._library.autograd"


def traced_region() -> tuple[Any, bool] | None:
    """The FX graph being recorded and whether the node now traced is in its backward part
    (AOTAutograd tags those nodes ``is_backward``); None when no graph is being recorded."""
    from torch.fx import traceback as fxt
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    mode = get_proxy_mode()
    if mode is None:
        return None
    return mode.tracer.graph, fxt.current_meta.get("partitioner_tag") == "is_backward"


def is_contiguous_or_false(t: torch.Tensor) -> bool:
    """``t.is_contiguous()`` that answers False instead of guarding on a symbolic size being 1
    (``Tensor.is_contiguous`` skips size-1 dims, so it guards on each size under tracing).
    A plain tensor (eager: concrete sizes) asks ``Tensor.is_contiguous``, the same answer in C++
    (the Python check took ~a quarter of the eager wrapper overhead)."""
    if type(t) is torch.Tensor:
        return t.is_contiguous()
    from torch._prims_common import is_contiguous_or_false as impl

    return bool(impl(t))


def definitely_less(a: Any, b: Any) -> bool:
    """``a < b`` for ints or SymInts, False where tracing cannot tell without a guard."""
    if type(a) is int and type(b) is int:
        return a < b
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    return bool(guard_or_false(a < b))


def skip_dynamo_frame(fn: Any) -> None:
    """Dynamo never compiles ``fn`` as a frame of its own (it still runs, eagerly). For
    ``ShardTensor.__new__``: called eagerly from a region dynamo fell back on, dynamo would
    compile it, break at ``_make_wrapper_subclass`` and fail resuming on the half-built wrapper
    ("AttributeError: _spec"). No cost outside dynamo."""
    from torch._dynamo.eval_frame import skip_code

    skip_code(fn.__code__)


def _as_tuple(x: Any) -> tuple:
    if x is None:
        return ()
    return (x,) if isinstance(x, (torch.Tensor, torch.autograd.graph.GradientEdge)) else tuple(x)


def run_backward(tensors: Any, grad_tensors: Any = None, retain_graph: bool | None = None,
                 create_graph: bool = False, grad_variables: Any = None,
                 inputs: Sequence[torch.Tensor] | torch.Tensor | None = None) -> None:
    """``torch.autograd.backward`` without torch-function dispatch of its arguments."""
    tensors = _as_tuple(tensors)
    if grad_tensors is None:
        grad_tensors = grad_variables
    grads = _make_grads(tensors, _tensor_or_tensors_to_tuple(grad_tensors, len(tensors)),
                        is_grads_batched=False)
    if retain_graph is None:
        retain_graph = create_graph
    _engine_run_backward(tensors, grads, retain_graph, create_graph, _as_tuple(inputs),
                         allow_unreachable=True, accumulate_grad=True)


def run_grad(outputs: Any, inputs: Any, grad_outputs: Any = None,
             retain_graph: bool | None = None, create_graph: bool = False,
             only_inputs: bool = True, allow_unused: bool | None = None,
             is_grads_batched: bool = False, materialize_grads: bool = False) -> tuple:
    """``torch.autograd.grad`` without torch-function dispatch of its arguments."""
    if is_grads_batched:
        msg = "torch.autograd.grad(is_grads_batched=True) on ShardTensors is not supported"
        raise NotImplementedError(msg)
    outputs, inputs = _as_tuple(outputs), _as_tuple(inputs)
    if allow_unused is None:
        allow_unused = materialize_grads
    grads = _make_grads(outputs, _tensor_or_tensors_to_tuple(grad_outputs, len(outputs)),
                        is_grads_batched=False)
    if retain_graph is None:
        retain_graph = create_graph
    result = _engine_run_backward(outputs, grads, retain_graph, create_graph, inputs,
                                  allow_unused, accumulate_grad=False)
    if materialize_grads:
        result = tuple(torch.zeros_like(i) if g is None else g for g, i in zip(result, inputs))
    return result
