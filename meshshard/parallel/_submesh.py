"""Moving a ShardTensor between a DeviceMesh and its sub-meshes (matched by dim names and the
ranks of each dim's process group), e.g. from ``mesh["domain"]`` onto ``("data", "domain",
"tensor")`` and back."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate

from meshshard.errors import LayoutError
from meshshard.shardtensor import ShardTensor
from meshshard.shardtensor._aten import wrap_local

__all__ = ["drop", "lift", "same_mesh"]


def same_mesh(a: DeviceMesh, b: DeviceMesh) -> bool:
    return a is b or a == b


def lift(x: Any, mesh: DeviceMesh) -> Any:
    """A ShardTensor on a sub-mesh of ``mesh`` (matched by dim names and process groups) as a
    ShardTensor on ``mesh``, Replicate on the other dims. No communication; differentiable."""
    if not isinstance(x, ShardTensor) or same_mesh(x._spec.mesh, mesh):
        return x
    src = x._spec.mesh
    placements: list[Any] = [Replicate()] * mesh.ndim
    sizes: list[Any] = [None] * mesh.ndim
    for i, j in enumerate(_dim_map(src, mesh)):
        placements[j], sizes[j] = x._spec.placements[i], x._spec.sizes[i]
    return wrap_local(x.to_local(), mesh, placements, sizes)


def drop(x: Any, mesh: DeviceMesh, target: DeviceMesh) -> Any:
    """Inverse of :func:`lift`: a ShardTensor on ``mesh`` back on its sub-mesh ``target``.
    Partial or Shard placements on the dims ``target`` lacks are reduced or gathered first
    (collective then); differentiable."""
    if not isinstance(x, ShardTensor) or not same_mesh(x._spec.mesh, mesh):
        return x
    idx = _dim_map(target, mesh)
    spec = x._spec
    if any(not isinstance(p, Replicate) for j, p in enumerate(spec.placements) if j not in idx):
        placements = [p if j in idx else Replicate() for j, p in enumerate(spec.placements)]
        x = x.redistribute(placements, list(spec.sizes))
        spec = x._spec
    return wrap_local(x.to_local(), target, [spec.placements[j] for j in idx],
                           [spec.sizes[j] for j in idx])


def _dim_map(src: DeviceMesh, mesh: DeviceMesh) -> list[int]:
    """For each dim of ``src``, the dim of ``mesh`` with its name and the same ranks."""
    names = src.mesh_dim_names
    out = []
    for i in range(src.ndim):
        n = names[i] if names else None
        ok = n is not None and mesh.mesh_dim_names is not None and n in mesh.mesh_dim_names
        if ok:
            j = mesh.mesh_dim_names.index(n)
            ok = dist.get_process_group_ranks(src.get_group(i)) == \
                dist.get_process_group_ranks(mesh.get_group(j))
        if not ok:
            msg = (
                f"a ShardTensor on mesh {tuple(src.shape)} (dims {names}) reached a "
                f"tensor-parallel module on mesh {tuple(mesh.shape)} (dims "
                f"{mesh.mesh_dim_names}): its mesh dim {i} ({n!r}) is not a dim of that mesh "
                "with the same ranks. Build inputs on the tensor-parallel mesh or on a "
                "sub-mesh of it, e.g. mesh['domain']"
            )
            raise LayoutError(msg)
        out.append(j)
    return out
