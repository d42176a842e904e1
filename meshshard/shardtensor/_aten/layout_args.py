"""The arguments of ``from_local``, checked: placements against the mesh, ``sharding_shapes``
in every accepted form (ours and PhysicsNeMo's), and every rank's local shape against the
declared sizes. This rank's own checks raise nothing before the layout exchange
(:mod:`~meshshard.shardtensor._aten.layout_exchange`), so every rank raises alike instead of
some hanging. Layout problems raise :class:`meshshard.errors.LayoutError` (a ValueError)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from meshshard.errors import LayoutError
from meshshard.shardtensor._aten.layout_exchange import (
    ERROR_TYPES,
    MAX_DIMS,
    Record,
    exchange,
    exchange_text,
    judge,
    sizes_key,
)

__all__ = ["PARTIAL_OPS", "comm_device", "even_sizes", "normalize_placements",
           "resolve_layout"]

PARTIAL_OPS = ("sum", "avg", "max", "min")


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
            shapes = [v for v in seq if isinstance(v, (torch.Size, tuple, list)) and v
                      and all(_is_int(k) for k in v)]
            bad = next((v for v in shapes if len(v) != ndim), None)
            if (mesh.ndim == 1 and len(seq) == mesh.size(0) != mesh.ndim  # not per mesh dim
                    and bad is not None):
                msg = (f"sharding_shapes holds a local shape of {len(bad)} dims, {tuple(bad)}, "
                       f"for a piece of {ndim} dims: give each rank's local shape, or its size")
                raise LayoutError(msg)
            if len(seq) != mesh.ndim:
                msg = (
                    f"sharding_shapes {sharding_shapes!r} has {len(seq)} entries for a "
                    f"{mesh.ndim}-d DeviceMesh of {tuple(mesh.shape)} ranks: {forms}"
                )
                raise LayoutError(msg)
            items = {i: s for i, s in enumerate(seq) if s is not None}
    else:
        msg = (f"sharding_shapes must be a list or a dict, got {type(sharding_shapes).__name__} "
               f"{sharding_shapes!r}")
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


def _local_problem(local: Any, mesh: DeviceMesh, placements: Any, sharding_shapes: Any):
    """(placements, declared sizes, None) or (None, None, the exception): this rank's own
    checks, which raise nothing, so that a rank at fault still joins the exchange."""
    try:
        if not isinstance(local, torch.Tensor) or hasattr(local, "_spec"):
            what = type(local).__name__
            hint = ("pass its .to_local() (or use redistribute() to change a layout)"
                    if isinstance(local, torch.Tensor) else "pass this rank's piece")
            msg = f"from_local needs a plain torch.Tensor, got a {what}: {hint}"
            raise TypeError(msg)
        if local.ndim > MAX_DIMS:
            msg = f"from_local: a piece of {local.ndim} dims; at most {MAX_DIMS} are supported"
            raise LayoutError(msg)
        if isinstance(placements, (str, bytes)) or not isinstance(placements, Sequence):
            msg = (f"placements must be a list with one placement per mesh dim, got "
                   f"{placements!r}")
            raise LayoutError(msg)
        placements = normalize_placements(placements, mesh, local.ndim)
        for p in placements:
            if isinstance(p, Partial) and p.reduce_op not in PARTIAL_OPS:
                msg = (f"from_local: Partial('{p.reduce_op}') is not supported; use one of "
                       f"{', '.join(f'Partial({o!r})' for o in PARTIAL_OPS)}")
                raise LayoutError(msg)
        sizes = _parse_sizes(sharding_shapes, placements, mesh, local.ndim)
    except Exception as exc:  # whatever it is, every rank must hear of it
        return None, None, exc
    return placements, sizes, None


def _record(local: Any, mesh: DeviceMesh, coord: list, placements: tuple | None, sizes,
            exc: Exception | None) -> Record:
    is_t = isinstance(local, torch.Tensor)
    ndim = min(local.ndim, MAX_DIMS) if is_t else -1
    pl = []
    for i in range(mesh.ndim):
        p = placements[i] if placements is not None else None
        if isinstance(p, Shard):
            pl.append((1, p.dim, ""))
        elif isinstance(p, Partial):
            pl.append((2, -1, p.reduce_op))
        else:
            pl.append((0 if isinstance(p, Replicate) else -1, -1, ""))
    error = 0
    if exc is not None:
        error = 1 + next((k for k, t in enumerate(ERROR_TYPES) if isinstance(exc, t)),
                         ERROR_TYPES.index(RuntimeError))
    return Record(
        rank=dist.get_rank() if dist.is_initialized() else 0, error=error, ndim=ndim,
        shape=tuple(local.shape[:MAX_DIMS]) if is_t else (),
        dtype=str(local.dtype).removeprefix("torch.") if is_t else "",
        device=local.device.type if is_t else "", coord=tuple(coord),
        placements=tuple(pl),
        declared=tuple(sizes_key(s) for s in (sizes or [None] * mesh.ndim)))


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
    says). Shared by every ShardTensor class, so they accept and refuse the same layouts.

    ``validate=True``: this rank's own checks do not raise; their outcome travels with the
    layout (:mod:`~meshshard.shardtensor._aten.layout_exchange`, one all-gather per mesh dim of
    size > 1, whatever the placements) and every rank raises the same error, or none does.
    ``validate=False``: no exchange unless sizes must be inferred (``sharding_shapes=None``
    with a Shard placement: then along the Shard mesh dims only, as a plain shape exchange);
    this rank's own checks raise here and now, and the other ranks are trusted.
    """
    coord = mesh.get_coordinate()
    if coord is None:
        msg = "this rank is not part of the DeviceMesh given to from_local"
        raise RuntimeError(msg)
    placements, sizes, exc = _local_problem(local, mesh, placements, sharding_shapes)
    if validate:
        dims = [i for i in range(mesh.ndim) if mesh.size(i) > 1]
    else:
        if exc is not None:
            raise exc
        dims = [i for i, p in enumerate(placements) if isinstance(p, Shard) and
                mesh.size(i) > 1]
        if sizes is not None or not dims:
            return _trusted(local, coord, placements, sizes)
    mine = _record(local, mesh, coord, placements, sizes, exc)
    device = comm_device(mesh)
    records = exchange(mesh, dims, mine, device)
    got, problem = judge(records)
    if problem is not None:
        text = _describe(exc) if exc is not None else ";".join(
            "None" if s is None else str(tuple(s)) for s in (sizes or [None] * mesh.ndim))
        texts = exchange_text(mesh, dims, mine.rank, text, device) if problem.needs_text else {}
        raise problem.kind(problem.message(texts, records))
    shape = list(local.shape)
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            shape[p.dim] = int(sum(got[i]))
    return placements, got, shape


def _describe(exc: Exception) -> str:
    """The message of this rank's own problem (its type too where that is not the kind every
    rank raises)."""
    return str(exc) if isinstance(exc, ERROR_TYPES) else f"{type(exc).__name__}: {exc}"


def _trusted(local: torch.Tensor, coord: list, placements: tuple, sizes) -> tuple:
    """The layout of ``validate=False`` with the sizes given: only this rank's own size is
    checked, no collective."""
    local_shape = tuple(local.shape)
    if sizes is None:
        sizes = [None] * len(placements)
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
