"""The arguments of ``from_local``, checked: placements against the mesh, ``sharding_shapes``
in every accepted form (ours and PhysicsNeMo's), and every rank's local shape against the
declared sizes (one all-gather of shapes, so every rank raises alike instead of some hanging).
Layout problems raise :class:`meshshard.errors.LayoutError` (a ValueError)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from meshshard.comm.check import check_collective
from meshshard.errors import LayoutError

__all__ = ["comm_device", "even_sizes", "normalize_placements", "resolve_layout"]


def even_sizes(n: int, parts: int) -> tuple[int, ...]:
    """Balanced sizes differing by at most one (the first ``n % parts`` get one more)."""
    base, extra = divmod(n, parts)
    return tuple(base + (1 if r < extra else 0) for r in range(parts))


def normalize_placements(placements: Sequence[Placement], mesh: DeviceMesh, ndim: int) -> tuple:
    """Check placements against the mesh and tensor rank; resolve negative Shard dims."""
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        msg = (
            f"placements {placements} has {len(placements)} entries but the DeviceMesh has "
            f"{mesh.ndim} dimension(s) {tuple(mesh.shape)}: give one placement per mesh dim"
        )
        raise LayoutError(msg)
    out = []
    seen: dict[int, int] = {}
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            d = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= d < max(ndim, 1) or ndim == 0:
                msg = f"Shard({p.dim}) on mesh dim {i} is out of range for a {ndim}-d tensor"
                raise LayoutError(msg)
            if d in seen:
                msg = (
                    f"tensor dim {d} is sharded by mesh dims {seen[d]} and {i}; nested sharding "
                    "of one tensor dim is not supported: shard different tensor dims"
                )
                raise NotImplementedError(msg)
            seen[d] = i
            out.append(Shard(d))
        elif isinstance(p, (Replicate, Partial)):
            out.append(p)
        else:
            msg = f"unknown placement {p!r}: use Shard(d), Replicate() or Partial(op)"
            raise TypeError(msg)
    return tuple(out)


def _parse_sizes(
    sharding_shapes: Any, placements: tuple, mesh: DeviceMesh, ndim: int
) -> list[tuple[int, ...] | None] | None:
    """Every rank's size of each sharded dim, from any of the accepted forms:

    - a flat list of sizes (one Shard placement): ``[3, 5]``;
    - a list per mesh dim (``None`` for non-Shard dims): ``[[3, 5]]``, ``[None, [2, 6]]``;
    - a dict ``{mesh_dim: sizes or per-rank shapes}`` (PhysicsNeMo's form):
      ``{0: (torch.Size([3, 4]), torch.Size([5, 4]))}``;
    - on a 1-D mesh, a list of per-rank shapes: ``[torch.Size([3, 4]), torch.Size([5, 4])]``.

    Anything else raises a ValueError that says which form was expected.
    """
    if sharding_shapes is None:
        return None
    shard_dims = [i for i, p in enumerate(placements) if isinstance(p, Shard)]
    forms = (
        "give a flat list of sizes ([3, 5]), a list per mesh dim ([[3, 5]]), a dict "
        "{mesh_dim: sizes or per-rank shapes}, or on a 1-D mesh a list of per-rank shapes"
    )
    if isinstance(sharding_shapes, dict):
        items = dict(sharding_shapes)
    elif isinstance(sharding_shapes, (list, tuple)):
        seq = list(sharding_shapes)
        if seq and all(_is_int(v) for v in seq):
            if len(shard_dims) != 1:
                msg = (
                    "a flat list of sharding sizes needs exactly one Shard placement; give a "
                    "dict {mesh_dim: sizes} instead"
                )
                raise LayoutError(msg)
            items = {shard_dims[0]: seq}
        elif (mesh.ndim == 1 and len(seq) == mesh.size(0) and shard_dims == [0]
              and all(_is_shape(v, ndim) for v in seq)):
            # one local shape per rank (PhysicsNeMo's list form); the per-mesh-dim form would
            # have one entry, so the two agree where they coincide (one rank, 1-d tensor)
            items = {0: seq}
        else:
            if len(seq) != mesh.ndim:
                msg = (
                    f"sharding_shapes {sharding_shapes!r} has {len(seq)} entries for a "
                    f"{mesh.ndim}-d DeviceMesh of {tuple(mesh.shape)} ranks: {forms}"
                )
                raise LayoutError(msg)
            items = {i: s for i, s in enumerate(seq) if s is not None}
    else:
        msg = f"sharding_shapes must be a list or a dict, got {type(sharding_shapes).__name__}"
        raise LayoutError(msg)
    out: list[tuple[int, ...] | None] = [None] * mesh.ndim
    for i, s in items.items():
        if not _is_int(i) or not 0 <= int(i) < mesh.ndim:
            msg = f"sharding_shapes names mesh dim {i!r}; the DeviceMesh has {mesh.ndim} dim(s)"
            raise LayoutError(msg)
        i = int(i)
        if i not in shard_dims:
            msg = f"sharding sizes given for mesh dim {i}, which is {placements[i]}, not Shard"
            raise LayoutError(msg)
        d = placements[i].dim
        if isinstance(s, torch.Size) or not isinstance(s, (list, tuple)) or len(s) != mesh.size(i):
            msg = (
                f"sharding_shapes for mesh dim {i} must hold one size or local shape per rank "
                f"({mesh.size(i)} of them), got {s!r}: {forms}"
            )
            raise LayoutError(msg)
        vals = []
        for v in s:
            if _is_shape(v, ndim):
                v = v[d]
            if not _is_int(v) or int(v) < 0:
                msg = (
                    f"sharding_shapes for mesh dim {i}: {v!r} is neither a size >= 0 nor a "
                    f"local shape of {ndim} dims: {forms}"
                )
                raise LayoutError(msg)
            vals.append(int(v))
        out[i] = tuple(vals)
    for i in shard_dims:
        if out[i] is None:
            msg = f"sharding sizes missing for Shard placement on mesh dim {i}"
            raise LayoutError(msg)
    return out


def _is_int(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (torch.is_tensor(v) and v.ndim == 0 and not
                                  v.is_floating_point())


def _is_shape(v: Any, ndim: int) -> bool:
    return isinstance(v, (torch.Size, tuple, list)) and len(v) == ndim and all(
        _is_int(k) for k in v)


def resolve_layout(
    local: torch.Tensor,
    mesh: DeviceMesh,
    placements: Sequence[Placement],
    sharding_shapes: Any = None,
    *,
    validate: bool = True,
) -> tuple[tuple, list, list]:
    """Placements, every rank's sizes of each sharded dim and the global shape of a tensor whose
    local piece on this rank is ``local`` (the checks of :func:`from_local`; collective as it
    says). Shared by every ShardTensor class, so they accept and refuse the same layouts."""
    placements = normalize_placements(placements, mesh, local.ndim)
    sizes = _parse_sizes(sharding_shapes, placements, mesh, local.ndim)
    coord = mesh.get_coordinate()
    if coord is None:
        msg = "this rank is not part of the DeviceMesh given to from_local"
        raise RuntimeError(msg)
    local_shape = tuple(local.shape)
    need_collective = sizes is None or validate
    need_collective = need_collective and any(isinstance(p, Shard) for p in placements)
    if need_collective:
        # one all-gather of local shapes along every sharded mesh dim
        shape_t = torch.tensor([local.ndim, *local_shape], dtype=torch.int64)
        shape_t = torch.cat([shape_t, torch.zeros(17 - shape_t.numel(), dtype=torch.int64)])
        shape_t = shape_t.to(comm_device(mesh))
        problems = []
        inferred: list[tuple[int, ...] | None] = [None] * mesh.ndim
        for i, p in enumerate(placements):
            if not isinstance(p, Shard):
                continue
            n = mesh.size(i)
            # append a fingerprint of this rank's declared sizes so disagreeing declarations
            # are seen by every rank
            decl = -1
            if sizes is not None:
                decl = len(sizes[i]) + sum((k + 1) * 1_000_003 * int(v) for k, v in
                                           enumerate(sizes[i])) % (1 << 61)
            vec = torch.cat([shape_t, torch.tensor([decl], dtype=torch.int64,
                                                   device=shape_t.device)])
            bufs = [torch.empty_like(vec) for _ in range(n)]
            if n > 1:
                check_collective("all_gather", mesh.get_group(i), vec, detail="local shapes")
                dist.all_gather(bufs, vec, group=mesh.get_group(i))
            else:
                bufs = [vec]
            if len({int(b[-1]) for b in bufs}) > 1:
                problems.append(
                    f"ranks declared different sharding sizes on mesh dim {i} (this rank: "
                    f"{None if sizes is None else tuple(sizes[i])}); pass the same sizes on "
                    "every rank"
                )
            along = [tuple(b[1 : 1 + int(b[0])].tolist()) for b in bufs]
            for c, shp in enumerate(along):
                other = [v for k, v in enumerate(shp) if k != p.dim]
                mine = [v for k, v in enumerate(local_shape) if k != p.dim]
                if len(shp) != local.ndim or other != mine:
                    problems.append(
                        f"mesh dim {i} coordinate {c} has local shape {shp}, this rank "
                        f"{local_shape}: shapes may differ only in the sharded dim {p.dim}"
                    )
            got = tuple(s[p.dim] if len(s) > p.dim else -1 for s in along)
            inferred[i] = got
            if sizes is not None and tuple(sizes[i]) != got:
                problems.append(
                    f"declared sharding sizes {tuple(sizes[i])} on mesh dim {i} disagree with the "
                    f"actual local sizes {got} of tensor dim {p.dim}"
                )
        if problems:
            msg = "from_local: " + "; ".join(problems)
            raise LayoutError(msg)
        sizes = inferred
    else:
        if sizes is None:
            sizes = [None] * mesh.ndim
        for i, p in enumerate(placements):
            if isinstance(p, Shard) and sizes[i][coord[i]] != local_shape[p.dim]:
                msg = (
                    f"from_local: declared size {sizes[i][coord[i]]} for this rank (mesh dim {i} "
                    f"coordinate {coord[i]}) disagrees with the local tensor's size "
                    f"{local_shape[p.dim]} along dim {p.dim}"
                )
                raise LayoutError(msg)
    shape = list(local_shape)
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            shape[p.dim] = int(sum(sizes[i]))
    return placements, sizes, shape


def comm_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)
