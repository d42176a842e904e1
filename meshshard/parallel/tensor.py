"""Megatron-style tensor parallelism for models whose activations are ShardTensors.

A *tensor-parallel plan* maps module names (``fnmatch`` patterns, like the keys of torch's
``parallelize_module`` plans) to a style:

- :class:`ColwiseParallel`: ``nn.Linear`` whose weight rows (output features) are split over
  the ``"tensor"`` mesh dim. Its output keeps the points sharded on ``"domain"`` and is sharded
  on the feature dim over ``"tensor"``; nothing is communicated forward (backward sums the
  input gradient over ``"tensor"``).
- :class:`RowwiseParallel`: ``nn.Linear`` whose weight columns (input features) are split. It
  contracts the sharded feature dim, so its output is ``Partial`` over ``"tensor"``; the
  reduction (one all-reduce) happens once, before the bias is added or the next op needs it.

Weights become ``torch.distributed.tensor.DTensor`` parameters on the ``"tensor"`` sub-mesh
(``Shard(0)`` for column-, ``Shard(1)`` for row-parallel), as with torch's own
``parallelize_module``, so optimizers, ``torch.distributed.checkpoint`` and FSDP2 see the usual
TP parameters. The *forward* is meshshard's: each call wraps the parameter's local piece as a
ShardTensor on the activation mesh and ``F.linear`` runs through ShardTensor's product
rule, which gives the layouts above and exact gradients (weight gradients summed over
``"domain"`` and ``"data"`` where activations are sharded; a replicated weight meeting
tensor-sharded activations, e.g. per-head projections, gets its gradient summed over
``"tensor"``).

Why not torch's ``ColwiseParallel`` / ``RowwiseParallel`` directly (torch 2.13)? They do not
compose with ShardTensor activations, for two reasons found by running them (4 gloo ranks,
2x2 ("domain", "tensor") mesh, the new aten-level ShardTensor):

1. Their input hook calls ``DTensor.from_local(x, ...)`` on the activation, which nests a
   ShardTensor inside a DTensor; the row-parallel output's redistribute then runs its
   all-reduce on the inner ShardTensor: ``NotImplementedError: ShardTensor has no sharding
   rule for _c10d_functional.all_reduce.default``. DTensor's layouts also follow
   ``torch.chunk`` sizes, not the uneven per-rank point counts a ShardTensor records.
2. Without the hooks, ``F.linear(shard_tensor, dtensor_weight)``: ``RuntimeError:
   aten.linear.default got mixed torch.Tensor and DTensor``.

So the parameters stay DTensors (for the rest of PyTorch) and the computation is ShardTensor's:
each call wraps the weight's local piece with ``from_local`` on the activation mesh, and
``F.linear`` goes through the new class's product rule (``meshshard::einsum``, see
``meshshard/shardtensor/rules/tp.py``), which keeps the points' uneven layout; there is
no second tensor type in the computation.

Under plain ``torch.compile`` the wrapping runs outside dynamo (a graph break at each
tensor-parallel linear and at the model's entry and exit); the rest of the model compiles.

Collectives: :func:`parallelize_module` communicates nothing (every rank slices its piece of
the identically initialised weights: build the model with the same seed on every rank). The
forward all-reduces each row-parallel output once over ``"tensor"``.
"""

from __future__ import annotations

import fnmatch
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from meshshard.errors import LayoutError
from meshshard.parallel._submesh import drop, lift, same_mesh
from meshshard.shardtensor import ShardTensor
from meshshard.shardtensor._aten import wrap_local

__all__ = [
    "ColwiseParallel",
    "RowwiseParallel",
    "TensorParallelPlanError",
    "init_mesh_3d",
    "parallelize_module",
]

MESH_DIM_NAMES = ("data", "domain", "tensor")


class TensorParallelPlanError(LayoutError):
    """A tensor-parallel plan that cannot be applied to the module or mesh given."""


@dataclass(frozen=True)
class ColwiseParallel:
    """Split an ``nn.Linear``'s output features over the tensor mesh dim.

    ``unit``: features move in whole groups of this size (e.g. ``dim_head``, so that attention
    heads are split over ``"tensor"`` and never cut); ``out_features`` must be divisible by
    ``unit * tensor_size``.
    """

    unit: int = 1

    def __str__(self) -> str:
        return "Colwise" if self.unit == 1 else f"Colwise(unit={self.unit})"


@dataclass(frozen=True)
class RowwiseParallel:
    """Split an ``nn.Linear``'s input features over the tensor mesh dim (output Partial, then
    reduced once). ``unit`` as in :class:`ColwiseParallel`, for ``in_features``."""

    unit: int = 1

    def __str__(self) -> str:
        return "Rowwise" if self.unit == 1 else f"Rowwise(unit={self.unit})"


ParallelStyle = ColwiseParallel | RowwiseParallel


def init_mesh_3d(
    data: int = 1, domain: int = 1, tensor: int = 1, *, device_type: str | None = None
) -> DeviceMesh:
    """The 3-D ``("data", "domain", "tensor")`` DeviceMesh over all ranks.

    Ranks are laid out data-major: the ``tensor`` ranks of one domain shard are neighbours
    (on GPUs: put them on one node, they all-reduce every row-parallel layer).
    Collective (creates process groups): every rank must call it.

    Raises
    ------
    ValueError
        If ``data * domain * tensor`` is not the world size, or a size is below 1.
    """
    sizes = (data, domain, tensor)
    if any(int(s) < 1 for s in sizes):
        msg = f"mesh sizes data={data}, domain={domain}, tensor={tensor} must all be >= 1"
        raise ValueError(msg)
    world = dist.get_world_size()
    if data * domain * tensor != world:
        msg = (
            f"data={data} x domain={domain} x tensor={tensor} = {data * domain * tensor} ranks, "
            f"but the world has {world}: choose sizes whose product is the world size"
        )
        raise ValueError(msg)
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return init_device_mesh(device_type, sizes, mesh_dim_names=MESH_DIM_NAMES)


@dataclass
class _TPLinear:
    """What a parallelized ``nn.Linear`` needs at forward time."""

    style: ParallelStyle
    mesh: DeviceMesh
    weight_layout: tuple  # (placements, sizes) of the weight piece on ``mesh``
    bias_layout: tuple | None  # None: plain replicated bias (row-parallel)


def _mesh_index(mesh: DeviceMesh, name: str) -> int:
    names = mesh.mesh_dim_names
    if not names or name not in names:
        msg = (
            f"the DeviceMesh {tuple(mesh.shape)} has dim names {names}, no {name!r}: build it "
            f"with init_mesh_3d(...) or mesh_dim_names=(..., {name!r})"
        )
        raise TensorParallelPlanError(msg)
    return names.index(name)


def _resolve_plan(
    module: nn.Module, plan: Mapping[str, ParallelStyle], tsize: int
) -> dict[str, ParallelStyle]:
    """Module name -> style, every check done before anything changes (same on every rank)."""
    modules = dict(module.named_modules())
    chosen: dict[str, tuple[str, ParallelStyle]] = {}
    problems = []
    for key, style in plan.items():
        if not isinstance(style, (ColwiseParallel, RowwiseParallel)):
            problems.append(
                f"plan entry {key!r}: {style!r} is not a meshshard ColwiseParallel or "
                "RowwiseParallel (torch's styles do not take ShardTensor activations)"
            )
            continue
        if style.unit < 1:
            problems.append(f"plan entry {key!r}: unit={style.unit} must be >= 1")
            continue
        names = [n for n in modules if n and fnmatch.fnmatchcase(n, key)]
        if not names:
            linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
            shown = ", ".join(linears[:8]) + (", ..." if len(linears) > 8 else "")
            problems.append(
                f"plan entry {key!r} names no module of {type(module).__name__} "
                f"(its nn.Linear modules: {shown or 'none'})"
            )
            continue
        for n in names:
            m = modules[n]
            if n in chosen and chosen[n][1] != style:
                problems.append(f"module {n!r} is matched by plan entries {chosen[n][0]!r} "
                                f"and {key!r} with different styles")
                continue
            chosen[n] = (key, style)
            if not isinstance(m, nn.Linear):
                problems.append(f"plan entry {key!r} -> {n!r} is a {type(m).__name__}; "
                                "tensor-parallel styles apply to nn.Linear")
                continue
            if hasattr(m, "_meshshard_tp"):
                problems.append(f"module {n!r} is already tensor-parallel")
                continue
            is_col = isinstance(style, ColwiseParallel)
            feat, what = (m.out_features, "out") if is_col else (m.in_features, "in")
            if feat % (style.unit * tsize):
                unit = f" in units of {style.unit} ({feat / style.unit:g} units)" \
                    if style.unit > 1 else ""
                problems.append(
                    f"plan entry {key!r} -> {n!r} ({style}): {what}_features={feat}{unit} "
                    f"cannot be split evenly over tensor={tsize} ranks; choose a tensor size "
                    f"that divides {feat // style.unit if feat % style.unit == 0 else feat}"
                )
    if problems:
        msg = "tensor-parallel plan cannot be applied: " + "; ".join(problems)
        raise TensorParallelPlanError(msg)
    return {n: s for n, (_, s) in chosen.items()}


def _weight_layout(mesh: DeviceMesh, t_idx: int, shape: torch.Size, dim: int) -> tuple:
    """Placements and per-rank sizes of a weight split evenly on ``dim`` over the tensor dim,
    replicated over the others."""
    tsize = mesh.size(t_idx)
    placements: list[Any] = [Replicate()] * mesh.ndim
    placements[t_idx] = Shard(dim)
    sizes: list[Any] = [None] * mesh.ndim
    sizes[t_idx] = (shape[dim] // tsize,) * tsize
    return tuple(placements), tuple(sizes)


def _shard_param(p: torch.Tensor, tmesh: DeviceMesh, dim: int) -> nn.Parameter:
    n = tmesh.size()
    r = tmesh.get_local_rank()
    piece = p.detach().chunk(n, dim=dim)[r].clone()
    dt = DTensor.from_local(piece, tmesh, [Shard(dim)], run_check=False)
    return nn.Parameter(dt, requires_grad=p.requires_grad)


def parallelize_module(
    module: nn.Module,
    mesh: DeviceMesh,
    plan: Mapping[str, ParallelStyle],
    *,
    tensor_dim: str = "tensor",
) -> nn.Module:
    """Apply a tensor-parallel ``plan`` to ``module`` in place (no model code changes).

    Parameters
    ----------
    module : nn.Module
        Built identically on every rank (same seed).
    mesh : DeviceMesh
        The mesh the activations live on, with a dim named ``tensor_dim``: e.g.
        ``init_mesh_3d(data, domain, tensor)`` or its ``mesh["domain", "tensor"]``. ShardTensor
        inputs on a sub-mesh without ``tensor_dim`` (e.g. ``mesh["domain"]``) are lifted to
        ``mesh`` (Replicate on the missing dims) and the outputs are returned on the inputs'
        mesh, so training code written for domain parallelism runs unchanged.
    plan : mapping of str to ColwiseParallel or RowwiseParallel
        Module-name patterns (``fnmatch``: ``"blocks.*.mlp.pre"``) -> style. See
        :func:`meshshard.parallel.plans.transolver_plan`.
    tensor_dim : str
        Name of the tensor-parallel mesh dim.

    Returns
    -------
    nn.Module
        ``module`` itself; planned linears hold DTensor weights on ``mesh[tensor_dim]``.

    Raises
    ------
    TensorParallelPlanError
        Before changing anything, on every rank alike: a plan entry that names no module, names
        something other than ``nn.Linear``, or a feature count that ``unit * tensor size`` does
        not divide; a mesh without ``tensor_dim``.

    Calling the module with ShardTensors on a mesh that is not a sub-mesh of ``mesh`` raises
    :class:`~meshshard.shardtensor.LayoutError` (on every rank: it is decided from the meshes).
    """
    t_idx = _mesh_index(mesh, tensor_dim)
    tsize = mesh.size(t_idx)
    chosen = _resolve_plan(module, plan, tsize)
    tmesh = mesh[tensor_dim] if mesh.ndim > 1 else mesh
    modules = dict(module.named_modules())
    for name, style in chosen.items():
        lin = modules[name]
        dim = 0 if isinstance(style, ColwiseParallel) else 1
        w_layout = _weight_layout(mesh, t_idx, lin.weight.shape, dim)
        lin.weight = _shard_param(lin.weight, tmesh, dim)
        b_layout = None
        if lin.bias is not None and dim == 0:
            b_layout = _weight_layout(mesh, t_idx, lin.bias.shape, 0)
            lin.bias = _shard_param(lin.bias, tmesh, 0)
        lin._meshshard_tp = _TPLinear(style, mesh, w_layout, b_layout)
        lin.forward = types.MethodType(_tp_linear_forward, lin)
    if not hasattr(module, "_meshshard_tp_root"):
        module._meshshard_tp_root = {"mesh": mesh, "stack": []}
        module.register_forward_pre_hook(_lift_inputs, with_kwargs=True)
        module.register_forward_hook(_return_outputs, with_kwargs=True, always_call=True)
    return module


# Wrapping a plain piece (a weight's, or an input's on a sub-mesh) as a ShardTensor is Python
# that dynamo cannot trace (it breaks at ``_make_wrapper_subclass``, then fails resuming inside
# ``__new__`` with "AttributeError: _spec"), so under ``torch.compile`` these run eagerly: a
# graph break at each tensor-parallel linear and at the model's entry and exit.
@torch.compiler.disable
def _tp_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    st: _TPLinear = self._meshshard_tp
    x = lift(x, st.mesh)
    w = wrap_local(self.weight.to_local(), st.mesh, *st.weight_layout)
    b = self.bias
    if b is not None and st.bias_layout is not None:
        b = wrap_local(b.to_local(), st.mesh, *st.bias_layout)
    return F.linear(x, w, b)


@torch.compiler.disable
def _lift_inputs(module: nn.Module, args: tuple, kwargs: dict):
    root = module._meshshard_tp_root
    mesh = root["mesh"]
    flat = [*args, *kwargs.values()]
    srcs = [t._spec.mesh for t in flat if isinstance(t, ShardTensor)]
    # what the outputs go back to: the inputs' sub-mesh, plain tensors, or nothing to do
    src = next((m for m in srcs if not same_mesh(m, mesh)), None if srcs else "plain")
    root["stack"].append(src)
    if not isinstance(src, DeviceMesh):
        return None
    args = tuple(lift(a, mesh) for a in args)
    kwargs = {k: lift(v, mesh) for k, v in kwargs.items()}
    return args, kwargs


@torch.compiler.disable
def _return_outputs(module: nn.Module, args: tuple, kwargs: dict, out: Any):
    root = module._meshshard_tp_root
    src = root["stack"].pop()  # always_call: popped even when the forward raised
    if src is None or out is None:
        return None
    mesh = root["mesh"]

    def back(o):
        if src == "plain":  # plain tensors in, plain tensors out (the full tensor)
            return o.full_tensor() if isinstance(o, ShardTensor) else o
        return drop(o, mesh, src)

    if isinstance(out, (tuple, list)):
        return type(out)(back(o) for o in out)
    if isinstance(out, dict):
        return {k: back(v) for k, v in out.items()}
    return back(out)
