"""Rank functions for the pipelines tests (module level so run_ranks can pickle them)."""

from __future__ import annotations

import numpy as np


def load_local(rank: int, world_size: int, store: str, part: str) -> dict:
    """Each rank reads its rows without a mesh; returns numpy copies."""
    from meshshard.datasets import load_shard

    keys = (
        (
            "surface_mesh_centers",
            "surface_normals",
            "surface_areas",
            "surface_fields",
            "surface_perm",
        )
        if part == "surface"
        else ("volume_mesh_centers", "volume_fields", "volume_perm")
    )
    out = load_shard(store, rank, world_size, part=part, keys=keys)
    return {k: v.numpy() for k, v in out.items()}


def load_sharded(rank: int, world_size: int, store: str) -> dict:
    """Each rank reads ShardTensors on a real DeviceMesh; checks their layout collectively."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.datasets import ShardedRunDataset, load_shard

    mesh = init_device_mesh("cpu", (world_size,))
    out = load_shard(store, rank, world_size, mesh=mesh, part="surface")
    plain = load_shard(store, rank, world_size, part="surface")
    sizes = tuple(int(s) for s in plain["sharding_sizes"])
    res = {"sizes": sizes}
    for k, st in out.items():
        assert st.sharding_sizes(mesh_dim=0) == sizes, (st.sharding_sizes(mesh_dim=0), sizes)
        assert st.shape[0] == sum(sizes)
        assert torch.equal(st.to_local(), plain[k])
        res[k] = st.full_tensor().numpy()
    ds = ShardedRunDataset(str(__import__("pathlib").Path(store).parent), mesh=mesh)
    res["dataset_len"] = len(ds)
    item = ds[0]
    res["dataset_keys"] = sorted(item)
    res["local_rows"] = int(item["surface_mesh_centers"].to_local().shape[0])
    return res


def stack(results: list[dict], key: str) -> np.ndarray:
    return np.concatenate([r[key] for r in results])


def load_sharded_error(rank: int, world_size: int, store: str) -> str:
    """Each rank loads a damaged store with a DeviceMesh; returns the error message."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.datasets import load_shard
    from meshshard.store import StoreError

    mesh = init_device_mesh("cpu", (world_size,))
    try:
        load_shard(store, rank, world_size, mesh=mesh, part="surface")
    except StoreError as exc:
        return str(exc)
    return "loaded without error"
