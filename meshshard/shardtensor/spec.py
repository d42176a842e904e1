"""The layout of a ShardTensor: mesh, placements and every rank's size of each sharded dim."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

__all__ = ["ShardSpec", "intern_spec", "mesh_group", "normalize_placements"]


def normalize_placements(placements: Sequence[Placement], mesh: DeviceMesh, ndim: int) -> tuple:
    """Check placements against the mesh and tensor rank; resolve negative Shard dims."""
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        msg = (
            f"placements {placements} has {len(placements)} entries but the DeviceMesh has "
            f"{mesh.ndim} dimension(s) {tuple(mesh.shape)}: give one placement per mesh dim"
        )
        raise ValueError(msg)
    out = []
    seen: dict[int, int] = {}
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            d = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= d < max(ndim, 1) or ndim == 0:
                msg = f"Shard({p.dim}) on mesh dim {i} is out of range for a {ndim}-d tensor"
                raise ValueError(msg)
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


@dataclass(frozen=True)
class ShardSpec:
    """Mesh + placements + per-rank sizes.

    ``sizes[i]`` is, for a ``Shard(d)`` placement on mesh dim ``i``, the tuple of the sizes of
    tensor dim ``d`` on each coordinate of mesh dim ``i`` (uneven, zeros allowed); ``None`` for
    Replicate/Partial. ``shape`` is the global shape.
    """

    mesh: DeviceMesh
    placements: tuple
    sizes: tuple
    shape: torch.Size

    # -------------------------------------------------------------- queries
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def shard_dims(self) -> dict[int, int]:
        """tensor dim -> mesh dim for every Shard placement."""
        return {p.dim: i for i, p in enumerate(self.placements) if isinstance(p, Shard)}

    def mesh_dim_of(self, tensor_dim: int) -> int | None:
        return self.shard_dims().get(tensor_dim)

    # The answers below are asked on every op; a spec is immutable, so each is computed once
    # and kept in the instance __dict__ (not a dataclass field: equality and hash ignore it).
    def is_replicated(self) -> bool:
        v = self.__dict__.get("_is_replicated")
        if v is None:
            v = all(isinstance(p, Replicate) for p in self.placements)
            self.__dict__["_is_replicated"] = v
        return v

    def has_partial(self) -> bool:
        v = self.__dict__.get("_has_partial")
        if v is None:
            v = any(isinstance(p, Partial) for p in self.placements)
            self.__dict__["_has_partial"] = v
        return v

    def nonreplicated_mesh_dims(self) -> tuple[int, ...]:
        return tuple(i for i, p in enumerate(self.placements) if not isinstance(p, Replicate))

    def coordinate(self) -> list[int]:
        coord = self.mesh.get_coordinate()
        if coord is None:
            msg = "this rank is not part of the ShardTensor's DeviceMesh"
            raise RuntimeError(msg)
        return list(coord)

    def local_shape(self, coord: Sequence[int] | None = None) -> torch.Size:
        if coord is None:  # this rank's shape: fixed for the spec's life
            v = self.__dict__.get("_local_shape")
            if v is None:
                v = self._local_shape(self.coordinate())
                self.__dict__["_local_shape"] = v
            return v
        return self._local_shape(coord)

    def _local_shape(self, coord: Sequence[int]) -> torch.Size:
        shape = list(self.shape)
        for i, p in enumerate(self.placements):
            if isinstance(p, Shard):
                shape[p.dim] = self.sizes[i][coord[i]]
        return torch.Size(shape)

    def offset(self, tensor_dim: int, coord: Sequence[int] | None = None) -> int:
        """Global start of this rank's rows along a sharded tensor dim."""
        i = self.mesh_dim_of(tensor_dim)
        if i is None:
            return 0
        coord = self.coordinate() if coord is None else coord
        return int(sum(self.sizes[i][: coord[i]]))

    # -------------------------------------------------------------- derivations
    def derived(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, remembered on this spec under ``key`` (a hashable description of the
        transformation, e.g. ``("reshape", (2, 8))``): a spec is immutable, so a rule that
        derives its output layout from its input layout alone computes it once per input spec,
        and repeated layers share spec objects. Errors raised by ``make`` are not remembered."""
        d = self.__dict__.get("_derived")
        if d is None:
            d = self.__dict__["_derived"] = {}
        v = d.get(key)
        if v is None:
            v = make()
            if len(d) < 256:
                d[key] = v
        return v

    def with_changes(self, **kw) -> ShardSpec:
        d = {"mesh": self.mesh, "placements": self.placements, "sizes": self.sizes}
        d["shape"] = self.shape
        d.update(kw)
        return ShardSpec(**d)

    @staticmethod
    def make(
        mesh: DeviceMesh,
        placements: Sequence[Placement],
        shape: Sequence[int],
        sizes: Sequence[Sequence[int] | None] | None = None,
    ) -> ShardSpec:
        """Build a spec; ``sizes=None`` means torch.chunk sizes for every Shard placement."""
        placements = normalize_placements(placements, mesh, len(shape))
        shape = torch.Size(shape)
        out_sizes = []
        for i, p in enumerate(placements):
            if isinstance(p, Shard):
                n = mesh.size(i)
                s = None if sizes is None else sizes[i]
                if s is None:
                    s = chunk_sizes(shape[p.dim], n)
                s = tuple(int(v) for v in s)
                if len(s) != n or any(v < 0 for v in s) or sum(s) != shape[p.dim]:
                    msg = (
                        f"sharding sizes {s} on mesh dim {i} must have {n} non-negative entries "
                        f"summing to the global size {shape[p.dim]} of tensor dim {p.dim}"
                    )
                    raise ValueError(msg)
                out_sizes.append(s)
            else:
                out_sizes.append(None)
        return ShardSpec(mesh, placements, tuple(out_sizes), shape)

    def describe(self) -> str:
        parts = []
        for i, p in enumerate(self.placements):
            s = f"{p}"
            if self.sizes[i] is not None:
                s += f"{list(self.sizes[i])}"
            parts.append(s)
        return f"[{', '.join(parts)}] global {tuple(self.shape)}"


def chunk_sizes(n: int, parts: int) -> tuple[int, ...]:
    """The sizes ``torch.chunk`` would give (trailing parts may be empty)."""
    if parts < 1:
        msg = f"parts={parts} must be >= 1"
        raise ValueError(msg)
    step = -(-n // parts) if n else 0
    out = []
    left = n
    for _ in range(parts):
        take = min(step, left)
        out.append(take)
        left -= take
    return tuple(out)


def even_sizes(n: int, parts: int) -> tuple[int, ...]:
    """Balanced sizes differing by at most one (the first ``n % parts`` get one more)."""
    base, extra = divmod(n, parts)
    return tuple(base + (1 if r < extra else 0) for r in range(parts))


_GROUPS: dict[int, tuple] = {}


def mesh_group(mesh: DeviceMesh, mesh_dim: int):
    """``mesh.get_group(mesh_dim)``, memoised per mesh object.

    ``DeviceMesh.get_group`` looks the group up by name in torch.distributed's registry on every
    call (~20 us) and sharding rules ask for it on every op. A mesh's groups never change, so
    they are kept here, keyed by the mesh's id and checked through a weak reference (an entry
    is dropped when its mesh dies, so a new mesh at a reused id is never confused with it).
    """
    entry = _GROUPS.get(id(mesh))
    if entry is None or entry[0]() is not mesh:
        key = id(mesh)
        entry = (weakref.ref(mesh, lambda _r, key=key: _GROUPS.pop(key, None)), {})
        _GROUPS[key] = entry
    groups = entry[1]
    g = groups.get(mesh_dim)
    if g is None:
        g = mesh.get_group(mesh_dim)
        groups[mesh_dim] = g
    return g


_INTERNED: dict = {}


def intern_spec(spec: ShardSpec) -> ShardSpec:
    """The one spec object of this layout (mesh object, placements, sizes, global shape).

    Rules that build a fresh spec per call (cat, reductions, the general pointwise rule) pass it
    through here, so the layouts that later rules derive from it (:meth:`ShardSpec.derived`)
    are computed once, not once per step. Bounded; entries of dead meshes are never returned
    (the mesh object itself is compared).
    """
    key = (id(spec.mesh), spec.placements, spec.sizes, tuple(spec.shape))
    try:
        hit = _INTERNED.get(key)
    except TypeError:  # unhashable placement: nothing to share
        return spec
    if hit is not None and hit.mesh is spec.mesh:
        return hit
    if len(_INTERNED) >= 4096:
        _INTERNED.clear()
    _INTERNED[key] = spec
    return spec
