"""Tensor-parallel plans for the reference models (module name -> style; no model edits)."""

from __future__ import annotations

from torch import nn

from meshshard.parallel.tensor import ColwiseParallel, RowwiseParallel

__all__ = ["transolver_plan"]


def transolver_plan(model: nn.Module) -> dict[str, ColwiseParallel | RowwiseParallel]:
    """The Megatron plan for :class:`meshshard.models.Transolver`.

    ::

        preprocess.pre              Colwise   (space+fun -> 2*hidden, gelu stays local)
        preprocess.post             Rowwise   (-> hidden; one all-reduce, then bias)
        blocks.*.attn.in_project_x  Colwise(unit=dim_head)   heads split over "tensor"
        blocks.*.attn.in_project_fx Colwise(unit=dim_head)
        blocks.*.attn.to_out        Rowwise(unit=dim_head)   (one all-reduce)
        blocks.*.mlp.pre            Colwise
        blocks.*.mlp.post           Rowwise   (one all-reduce)

    Everything else stays replicated: the per-head slice projection, ``to_q/k/v`` and the
    temperature act on the local heads (their gradients are summed over ``"tensor"``); layer
    norms, the placeholder and the output head see replicated features. Per block, two
    all-reduces over ``"tensor"`` (attention and MLP) plus Physics-Attention's two reductions
    over ``"domain"``, which now carry only the local heads.

    ``unit=dim_head`` makes the heads the unit of the split: ``heads`` must be divisible by
    the tensor size, else :func:`~meshshard.parallel.tensor.parallelize_module` raises
    naming the module.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or not hasattr(model, "preprocess"):
        msg = (
            f"transolver_plan expects a meshshard.models.Transolver (preprocess, blocks), got "
            f"{type(model).__name__}"
        )
        raise TypeError(msg)
    plan: dict[str, ColwiseParallel | RowwiseParallel] = {
        "preprocess.pre": ColwiseParallel(),
        "preprocess.post": RowwiseParallel(),
    }
    if len(blocks):
        d = int(blocks[0].attn.dim_head)
        plan.update({
            "blocks.*.attn.in_project_x": ColwiseParallel(unit=d),
            "blocks.*.attn.in_project_fx": ColwiseParallel(unit=d),
            "blocks.*.attn.to_out": RowwiseParallel(unit=d),
            "blocks.*.mlp.pre": ColwiseParallel(),
            "blocks.*.mlp.post": RowwiseParallel(),
        })
    return plan
