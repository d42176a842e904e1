"""Data parallelism (DDP or FSDP2) over the ``"data"`` mesh dim, with ShardTensor inputs.

On a 2-D mesh ``("data", "domain")`` every data group trains on its own sample, cut over the
``domain`` ranks as ShardTensors. Inside a data group the weights are replicated and their
gradients are already exact (ShardTensor's backward all-reduces them over ``domain``), so the
data axis only has to average gradients across groups:

- ``mode="ddp"``: :class:`torch.nn.parallel.DistributedDataParallel` on the ``data`` process
  group (one group per domain coordinate). Every rank holds the full parameters and optimizer
  state.
- ``mode="fsdp"``: FSDP2 :func:`torch.distributed.fsdp.fully_shard` on each block and on the
  root. By default it shards over ``data`` *and* ``domain`` flattened into one dim. That is
  exact: every domain rank of a group has the same full gradient, so FSDP's averaging
  reduce-scatter over the flat dim equals the average over ``data``. And it saves memory: the
  domain ranks would otherwise each keep an identical copy of the parameters, gradients and
  Adam state; flattened, each rank keeps ``1 / (data * domain)`` of them (``1 / data`` when
  sharding over ``data`` only).

Both need the weights identical on every rank before wrapping (FSDP2 keeps each rank's own
slice of *its* copy); :func:`check_same_weights` verifies that and raises on every rank.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["check_same_weights", "data_parallel", "fsdp_mesh"]

_MODES = ("ddp", "fsdp")


def fsdp_mesh(mesh: DeviceMesh, dims: Sequence[str]) -> DeviceMesh:
    """The 1-D mesh FSDP2 shards over: ``mesh[dim]`` for one dim, else ``dims`` flattened
    (named ``"data_domain"`` for ``("data", "domain")``; reused when it already exists)."""
    dims = tuple(dims)
    names = mesh.mesh_dim_names or ()
    missing = [d for d in dims if d not in names]
    if not dims or missing:
        msg = f"fsdp_mesh: mesh dims {list(missing or dims)} not in the mesh's dims {list(names)}"
        raise ValueError(msg)
    if len(dims) == 1:
        return mesh[dims[0]]
    name = "_".join(dims)
    try:
        return mesh[name]
    except (KeyError, ValueError, RuntimeError):
        return mesh[dims]._flatten(name)


def _fingerprint(model: nn.Module) -> int:
    crc = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        crc = zlib.crc32(name.encode(), crc)
        local = t.detach()
        if hasattr(local, "to_local"):
            local = local.to_local()
        crc = zlib.crc32(local.cpu().contiguous().view(torch.uint8).numpy().tobytes(), crc)
    return crc


def check_same_weights(model: nn.Module, mesh: DeviceMesh, skip: Sequence[str] = ()) -> None:
    """Raise ValueError on *every* rank of ``mesh`` unless all ranks hold bit-identical
    parameters and buffers (a CRC32 per rank, gathered over each mesh dim in turn). Dims named
    in ``skip`` (e.g. ``"tensor"``, whose ranks hold different slices) are not compared.

    Collective: every rank of the mesh must call this.
    """
    vec = torch.tensor([_fingerprint(model)], dtype=torch.int64)
    if mesh.device_type == "cuda":
        vec = vec.cuda()
    names = mesh.mesh_dim_names or ()
    for i in range(mesh.ndim):
        n = mesh.size(i)
        if n == 1 or (names and names[i] in skip):
            continue
        bufs = [torch.empty_like(vec) for _ in range(n)]
        dist.all_gather(bufs, vec, group=mesh.get_group(i))
        vec = torch.cat(bufs)  # after the last dim: every rank's fingerprint, on every rank
    values = vec.tolist()
    if len(set(values)) > 1:
        msg = (
            f"data_parallel: the model's weights differ between ranks (CRC32 per rank: "
            f"{values}); build it from the same seed on every rank (torch.manual_seed) or load "
            "the same checkpoint before wrapping"
        )
        raise ValueError(msg)


def _default_blocks(model: nn.Module) -> list[nn.Module]:
    """The entries of every ``nn.ModuleList`` (e.g. Transolver's ``blocks``), outermost only."""
    out: list[nn.Module] = []
    seen: set[int] = set()
    for m in model.modules():
        if id(m) in seen:
            continue
        if isinstance(m, nn.ModuleList):
            for b in m:
                out.append(b)
                seen.update(id(x) for x in b.modules())
    return out


def _average_grads(model: nn.Module, mesh: DeviceMesh, data_dim: str) -> nn.Module:
    """DDP's arithmetic for tensor-parallel models: each parameter's gradient is averaged over
    ``data_dim`` as soon as it is accumulated (the local slice of a DTensor gradient). Torch's
    DDP needs ``_pre_dp_module_transform``, which swaps the DTensor parameters for plain ones
    so that optimizer and checkpoint no longer see the parameters the model holds; this keeps
    them DTensors. Returns ``model`` itself (hooks registered)."""
    group, n = mesh.get_group(data_dim), mesh.size(mesh.mesh_dim_names.index(data_dim))
    if n == 1:
        return model

    def average(p: torch.Tensor) -> None:
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.all_reduce(g, group=group)
        g.div_(n)

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(average)
    return model


def data_parallel(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    mode: str = "ddp",
    data_dim: str = "data",
    shard_dims: Sequence[str] | None = None,
    blocks: Iterable[nn.Module] | None = None,
    check_weights: bool = True,
    **kwargs: Any,
) -> nn.Module:
    """Wrap ``model`` for data parallelism over ``data_dim`` of ``mesh``.

    Parameters
    ----------
    model : nn.Module
        Plain torch model (e.g. :class:`meshshard.models.Transolver`), called on ShardTensors.
    mesh : DeviceMesh
        Named mesh containing ``data_dim`` (e.g. ``("data", "domain")``).
    mode : ``"ddp"`` or ``"fsdp"``
    shard_dims : sequence of mesh dim names, optional
        FSDP2 only: dims to shard parameters over (flattened). Default: every dim of the mesh
        (``("data", "domain")``), which gives the smallest per-rank state.
    blocks : modules, optional
        FSDP2 only: submodules to ``fully_shard`` before the root (their parameters are
        gathered one block at a time). Default: the entries of the model's ``nn.ModuleList``\\ s.
    check_weights : bool
        Verify the weights are identical on every rank first (collective; default True).
    **kwargs
        Passed to ``DistributedDataParallel`` or ``fully_shard`` (e.g. ``mp_policy=...``).

    Returns
    -------
    nn.Module
        The DDP module (``mode="ddp"``) or ``model`` itself, fully sharded in place (``"fsdp"``).

    Raises
    ------
    ValueError
        Unknown mode or mesh dim, ``find_unused_parameters=True`` (use ``static_graph=True``),
        or weights that differ between ranks (on every rank).

    Collective: every rank of the mesh must call this.
    """
    if mode not in _MODES:
        msg = f"data_parallel: mode={mode!r} must be one of {_MODES}"
        raise ValueError(msg)
    names = mesh.mesh_dim_names or ()
    if data_dim not in names:
        msg = f"data_parallel: data_dim={data_dim!r} is not a dim of the mesh {list(names)}"
        raise ValueError(msg)
    if mode == "ddp" and kwargs.get("find_unused_parameters"):
        msg = (
            "data_parallel: find_unused_parameters=True is not supported with ShardTensor "
            "inputs: DDP searches the C++ autograd graph from the outputs, and a ShardTensor "
            "keeps its graph on its local piece, so every parameter would look unused. Use "
            "static_graph=True (its first iteration finds unused parameters by running "
            "backward) or make every parameter take part in the loss"
        )
        raise ValueError(msg)
    from torch.distributed.tensor import DTensor

    tensor_parallel = any(isinstance(p, DTensor) for p in model.parameters())
    if tensor_parallel and mode == "fsdp":
        msg = (
            "data_parallel: mode='fsdp' on tensor-parallel weights (DTensor parameters from "
            "meshshard.parallel.tensor) is not supported; use mode='ddp'"
        )
        raise ValueError(msg)
    if check_weights:
        check_same_weights(model, mesh, skip=("tensor",) if tensor_parallel else ())
    if mode == "ddp" and tensor_parallel:
        return _average_grads(model, mesh, data_dim)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if mesh.device_type == "cuda" and "device_ids" not in kwargs:
            kwargs["device_ids"] = [torch.cuda.current_device()]
        return DistributedDataParallel(model, process_group=mesh.get_group(data_dim), **kwargs)
    from torch.distributed.fsdp import fully_shard

    flat = fsdp_mesh(mesh, tuple(names) if shard_dims is None else tuple(shard_dims))
    for block in _default_blocks(model) if blocks is None else list(blocks):
        _no_view_outputs(block)
        fully_shard(block, mesh=flat, **kwargs)
    _no_view_outputs(model)
    fully_shard(model, mesh=flat, **kwargs)
    return model


def _no_view_outputs(module: nn.Module) -> None:
    """Make ``module`` return no view tensors, before FSDP2 sees them.

    FSDP2 registers its pre-backward hook on a wrapped module's outputs and warns that an
    in-place op on a *view* output would drop it (wrong gradients). A ShardTensor output of a
    ``Linear`` on (B, N, C) inputs is a view (the op decomposes to view/mm/view at dispatch), so
    the outputs that are views are cloned by a forward hook that runs before FSDP2's (it is
    registered first): one copy of the module's output, nothing else changes.
    """
    from torch.utils._pytree import tree_map

    def copy_views(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t._base is not None and t.requires_grad:
            return t.clone()
        return t

    def hook(mod: nn.Module, args: Any, output: Any) -> Any:
        return tree_map(copy_views, output)

    module.register_forward_hook(hook)
