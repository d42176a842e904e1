"""Read one rank's rows of a sharded run store: no collective, one contiguous slice per array.

Rank ``r`` of ``world_size`` reads stored rows ``ptr[r]:ptr[r + 1]`` of every requested array,
where ``ptr`` is the store's ``partition_ptr``. When ``world_size`` divides the store's
``nparts``, every rank takes ``nparts // world_size`` neighbouring parts (the partitioners keep
neighbouring parts close, so merged shards stay compact).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.datasets.curator import is_curator_store, load_curator_shard
from meshshard.datasets.rows import target_device, wrap_rows
from meshshard.store.format import (
    STL_KEYS,
    SURFACE_KEYS,
    VOLUME_KEYS,
    StoreError,
    open_store,
    read_array,
)

__all__ = ["ShardedRunDataset", "load_halo", "load_shard", "rank_rows"]

log = logging.getLogger(__name__)

_DEFAULT_KEYS = {"surface": SURFACE_KEYS, "volume": VOLUME_KEYS, "stl": STL_KEYS}


def rank_rows(ptr: Sequence[int], world_size: int, *, store: str = "store") -> np.ndarray:
    """Row pointer (length ``world_size + 1``) of ``world_size`` ranks over a store cut into
    ``len(ptr) - 1`` parts.

    Raises
    ------
    ValueError
        When ``world_size`` does not divide the number of parts.
    """
    ptr = np.asarray(ptr, dtype=np.int64)
    nparts = ptr.size - 1
    if world_size < 1:
        msg = f"world_size={world_size} must be >= 1"
        raise ValueError(msg)
    if nparts % world_size:
        divisors = [d for d in range(1, nparts + 1) if nparts % d == 0]
        msg = (
            f"{store}: stored with {nparts} parts, which {world_size} ranks cannot share "
            f"(world_size must divide nparts: one of {divisors}); run with such a world size "
            f"or re-run meshshard preprocess --parts {world_size} --overwrite"
        )
        raise ValueError(msg)
    return ptr[:: nparts // world_size]


def load_shard(
    store: str | Path,
    rank: int,
    world_size: int,
    *,
    mesh: Any = None,
    part: str = "surface",
    keys: Sequence[str] | None = None,
    device: Any = None,
) -> dict[str, Any]:
    """This rank's rows of a run store, as ShardTensors (with ``mesh``) or local tensors.

    No collective for meshshard's stores: every rank computes the sharding shapes from the
    store's ``partition_ptr``. A physicsnemo-curator store (:mod:`.curator`) has no partition:
    then this is a collective (every rank of ``mesh``, else of the default group, must call
    it): each rank reads a slice and the ranks partition the rows into ``world_size`` parts.

    Parameters
    ----------
    store : path
        A ``run_<i>.zarr`` written by :func:`meshshard.pipelines.preprocess_runs`.
    rank, world_size : int
        This rank and the number of ranks sharing the sample.
    mesh : DeviceMesh, optional
        1-D device mesh of ``world_size`` ranks; when given, values are
        :class:`~meshshard.shardtensor.ShardTensor` with placement ``Shard(0)`` and the
        store's sharding shapes.
    part : {"surface", "volume", "stl"}
        ``"stl"`` arrays are not sharded: every rank gets them whole (plain tensors).
    keys : sequence of str, optional
        Arrays to read (default: the part's centres, normals/areas and fields). ``"<part>_perm"``
        (stored row -> source cell id) may be added.
    device : torch.device, optional
        Default: the mesh's device type, else CPU.

    Returns
    -------
    dict
        key -> ShardTensor of global shape (N, ...) (with ``mesh``), or key -> Tensor of local
        shape (n_rank, ...) plus ``"sharding_sizes"``: int64 Tensor of shape (world_size,).

    Raises
    ------
    StoreError
        Incomplete/corrupt store, newer schema, or a part the store lacks.
    ValueError
        ``world_size`` does not divide the store's ``nparts``; bad rank; unknown key.
    """
    import torch

    if part not in _DEFAULT_KEYS:
        msg = f"part={part!r} must be one of {sorted(_DEFAULT_KEYS)}"
        raise ValueError(msg)
    if not 0 <= rank < world_size:
        msg = f"rank={rank} out of range for world_size={world_size}"
        raise ValueError(msg)
    if mesh is not None and mesh.size(0) != world_size:
        msg = f"mesh has {mesh.size(0)} ranks but world_size={world_size}"
        raise ValueError(msg)
    if is_curator_store(store):  # collective: the ranks partition together
        return load_curator_shard(store, rank, world_size, mesh=mesh, part=part, keys=keys,
                                  device=device)
    group, attrs = open_store(store)
    if part != "stl" and attrs.get(part) is None:
        msg = f"{store}: has no {part} part; preprocess it with --{part}"
        raise StoreError(msg)
    keys = tuple(keys) if keys is not None else _DEFAULT_KEYS[part]
    present = attrs.get("arrays", {})
    for k in keys:
        if k not in present:
            msg = f"{store}: no array {k!r}; it has {sorted(present)}"
            raise StoreError(msg) if k.startswith(part) else ValueError(msg)
    dev = target_device(mesh, device)
    if part == "stl":
        return {k: torch.from_numpy(read_array(group, store, k)).to(dev) for k in keys}
    ptr = rank_rows(attrs[part]["partition_ptr"], world_size, store=str(store))
    sizes = np.diff(ptr).tolist()
    lo, hi = int(ptr[rank]), int(ptr[rank + 1])
    return wrap_rows({k: read_array(group, store, k, slice(lo, hi)) for k in keys}, mesh, sizes,
                     dev)


def load_halo(store: str | Path, rank: int, *, part: str = "surface") -> dict[str, np.ndarray]:
    """This rank's halo routing (stored when preprocessing had ``--halo-radius``).

    Returns ``send_ptr`` (P+1,), ``send_idx`` (local rows), ``recv_ptr`` (P+1,), ``recv_idx``
    (global stored rows), as in :class:`~meshshard.partition.HaloPlan`. Requires
    world_size == nparts.
    """
    group, attrs = open_store(store)
    a = attrs.get(part)
    if a is None or a.get("halo") is None:
        msg = f"{store}: no halo routing for {part}; preprocess with --halo-radius R"
        raise StoreError(msg)
    nparts = attrs["nparts"]
    if not 0 <= rank < nparts:
        msg = f"rank={rank} out of range: the halo plan has {nparts} parts"
        raise ValueError(msg)
    out = {}
    for side in ("send", "recv"):
        key = f"{part}_halo_{side}"
        split = read_array(group, store, f"{key}_split")
        n_idx = attrs["arrays"][f"{key}_idx"][0]
        if split.shape != (nparts + 1,) or split[0] != 0 or split[-1] != n_idx or (
            np.diff(split) < 0
        ).any():
            msg = f"{store}: {key}_split is not a pointer over {nparts} parts into {n_idx} rows"
            raise StoreError(msg)
        out[f"{side}_ptr"] = read_array(group, store, f"{key}_ptr", rank)
        out[f"{side}_idx"] = read_array(
            group, store, f"{key}_idx", slice(int(split[rank]), int(split[rank + 1]))
        )
    return out


class ShardedRunDataset:
    """A torch-style map dataset over the ``run_*.zarr`` stores under ``root``.

    Item ``i`` is :func:`load_shard` of the ``i``-th store (sorted by run number) for this
    rank: a dict of ShardTensors (with ``mesh``) or of local tensors plus ``sharding_sizes``.
    Use ``DataLoader(ds, batch_size=None)`` (samples have different sizes).

    Parameters
    ----------
    root : path
        Directory holding ``run_<i>.zarr`` stores (temporaries are ignored).
    rank, world_size : int, optional
        Default: from ``mesh``, else from an initialised ``torch.distributed``, else 0 and 1.
    mesh, part, keys, device
        As in :func:`load_shard`.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        mesh: Any = None,
        part: str = "surface",
        keys: Sequence[str] | None = None,
        device: Any = None,
    ):
        import re

        self.root = Path(root)
        if not self.root.is_dir():
            msg = f"{self.root}: no such directory of run stores"
            raise FileNotFoundError(msg)
        found = []
        for p in self.root.iterdir():
            m = re.fullmatch(r"(.*?)(\d+)\.zarr", p.name)
            if m and p.is_dir():
                found.append((m.group(1), int(m.group(2)), p))
        self.stores = [p for _, _, p in sorted(found)]
        if not self.stores:
            msg = f"{self.root}: no run_<i>.zarr stores; run meshshard preprocess first"
            raise FileNotFoundError(msg)
        if mesh is not None:
            rank = mesh.get_local_rank(0) if rank is None else rank
            world_size = mesh.size(0) if world_size is None else world_size
        if rank is None or world_size is None:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank, world_size = dist.get_rank(), dist.get_world_size()
            else:
                rank, world_size = 0, 1
        self.rank, self.world_size = int(rank), int(world_size)
        self.mesh, self.part, self.keys, self.device = mesh, part, keys, device

    def __len__(self) -> int:
        return len(self.stores)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return load_shard(
            self.stores[i],
            self.rank,
            self.world_size,
            mesh=self.mesh,
            part=self.part,
            keys=self.keys,
            device=self.device,
        )
