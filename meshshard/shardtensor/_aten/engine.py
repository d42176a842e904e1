"""The autograd engine's entries for ShardTensors: ``Tensor.backward``,
``torch.autograd.backward`` and ``torch.autograd.grad`` (``ShardTensor.__torch_function__``
routes them here through ``tensor._ENGINE_ENTRIES``).

They run the engine without torch-function handling of their arguments, open the
weight-gradient bucket (:mod:`.grad_bucket`) where it applies and finish it when the engine is
done, and turn a ShardTensor left in a plain leaf's ``.grad`` into the plain global gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from meshshard.shardtensor._aten import grad_bucket
from meshshard.shardtensor._aten._torch_private import (
    run_backward,
    run_grad,
    tracing_a_joint_graph,
)
from meshshard.shardtensor._aten.collective_ops import keep_checkpointed_collectives_saved
from meshshard.shardtensor._aten.compiled_outputs import in_layout
from meshshard.shardtensor._aten.tensor import (
    _ENGINE_ENTRIES,
    ShardTensor,
    reduce_flattened,
)

__all__: list = []


def _tensor_backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """``Tensor.backward`` without going through torch-function handling again."""
    return _backward(self, gradient, retain_graph, create_graph, inputs=inputs)


def _backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
              grad_variables=None, inputs=None):  # fmt: skip
    """``torch.autograd.backward``; inside :func:`.grad_bucket.bucket_weight_grads` the plain
    leaves' Partial gradients (weights used with ShardTensors) are summed in one collective per
    (mesh, dtype, dims) once the engine is done and added to their ``.grad``, instead of one
    collective per layer."""
    roots = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    grad_tensors = _in_root_layouts(roots, grad_tensors)
    leaves = _plain_leaves(roots)
    # a leaf with tensor hooks keeps its per-node sum, so its hooks see the summed gradient
    bucketed = [v for v in leaves if not _has_hooks(v)]
    enabled = grad_bucket.eager_backward() and not create_graph and inputs is None \
        and bool(bucketed)
    with grad_bucket.collecting(bucketed, enabled) as b:
        run_backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)
    _complete_plain_leaf_grads(leaves)
    if b is not None:
        with torch.no_grad():
            for v, g in zip(bucketed, grad_bucket.finish(b, [None] * len(bucketed),
                                                         reduce_flattened)):  # fmt: skip
                if g is not None:
                    _accumulate(v, g)


def _in_root_layouts(roots: tuple, grads: Any) -> Any:
    """``grads`` (given for ``roots``) with each gradient of a compiled graph's output in that
    output's layout: the compiled backward takes no other, and only the mesh and placements of
    the traced layout reach ``__coerce_same_metadata_as_tangent__`` (see
    :mod:`.compiled_outputs`). Others as given."""
    if grads is None:
        return grads
    single = isinstance(grads, torch.Tensor)
    gs = (grads,) if single else tuple(grads)
    if len(gs) != len(roots):
        return grads  # (torch's own error)
    out = []
    for r, g in zip(roots, gs):
        out.append(in_layout(g, r._spec) if type(r) is ShardTensor and "_from_graph" in
                   r.__dict__ else g)  # fmt: skip
    return out[0] if single else out


def _plain_leaves(roots) -> list:
    """The plain leaves that need a gradient under ``roots`` (the variables of the graph's
    AccumulateGrad nodes), in one walk of the graph: same graph, same order on every rank."""
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set = set()
    out = []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        v = getattr(node, "variable", None)
        if v is not None:
            if type(v) is not ShardTensor:
                out.append(v)
            continue
        stack.extend(n for n, _ in node.next_functions)
    return out


def _has_hooks(v: torch.Tensor) -> bool:
    return bool(v._backward_hooks) or bool(getattr(v, "_post_accumulate_grad_hooks", None))


def _accumulate(v: torch.Tensor, g: torch.Tensor) -> None:
    """Add ``g`` to ``v.grad`` as the engine's AccumulateGrad would (``.grad`` laid out as
    ``v``; a new tensor, never a view of the bucket's flat buffer shared with others)."""
    if v.grad is None:
        v.grad = torch.empty_like(v, memory_format=torch.preserve_format).copy_(g)
    else:
        v.grad += g


def _complete_plain_leaf_grads(leaves) -> None:
    """Make a ShardTensor left in a plain leaf's ``.grad`` the plain global gradient.

    torch runs a custom ``autograd.Function`` without torch-function handling, so its plain
    inputs (weights) are not lifted as they are for every torch op, and its backward may give
    them a ShardTensor gradient (e.g. a Partial sum over points). ``leaves`` come from one
    walk of the graph before ``backward`` (same order on every rank: the reduction is
    collective). No torch function is patched."""
    for v in leaves:
        if type(v.grad) is ShardTensor:
            with torch.no_grad():
                v.grad = v.grad.full_tensor()


def _grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
          only_inputs=True, allow_unused=None, is_grads_batched=False, materialize_grads=False):
    """``torch.autograd.grad``; the plain inputs' Partial gradients are summed in one
    collective at the end (:mod:`.grad_bucket`), eager or while a joint graph is traced."""
    keep_checkpointed_collectives_saved()
    if grad_outputs is not None:
        outs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        grad_outputs = _in_root_layouts(outs, grad_outputs)
    one = isinstance(inputs, (torch.Tensor, torch.autograd.graph.GradientEdge))
    ins = (inputs,) if one else tuple(inputs)
    plain = [None if type(t) is ShardTensor else t for t in ins]
    enabled = not create_graph and (tracing_a_joint_graph() or not torch.compiler.is_compiling())
    with grad_bucket.collecting(plain, enabled) as b:
        if b is None:
            return run_grad(outputs, ins, grad_outputs, retain_graph, create_graph,
                            only_inputs, allow_unused, is_grads_batched, materialize_grads)
        res = run_grad(outputs, ins, grad_outputs, retain_graph, create_graph, only_inputs,
                       True, is_grads_batched, False)
    res = grad_bucket.finish(b, res, reduce_flattened)
    if materialize_grads:
        return tuple(torch.zeros_like(i) if g is None else g for g, i in zip(res, ins))
    if not allow_unused and any(g is None for g in res):
        msg = ("One of the differentiated Tensors appears to not have been used in the graph. "
               "Set allow_unused=True if this is the desired behavior.")
        raise RuntimeError(msg)
    return res


_ENGINE_ENTRIES.update({torch.Tensor.backward: _tensor_backward,
                        torch.autograd.backward: _backward, torch.autograd.grad: _grad})
