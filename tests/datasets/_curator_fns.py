"""Rank functions for tests/datasets/test_curator.py."""

from __future__ import annotations


def load_rank(rank: int, world: int, store: str, root: str) -> dict:
    """This rank's rows of a curator store through load_shard (plain and as ShardTensors) and
    through ShardedRunDataset."""
    import zarr
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.datasets import ShardedRunDataset, load_shard

    reads: list = []  # every row selection of a part array, to show no rank reads it whole
    orig = zarr.Array.__getitem__

    def spy(self, sel):
        name = self.path.rsplit("/", 1)[-1]
        if name.startswith(("surface_", "volume_")):
            reads.append((name, sel))
        return orig(self, sel)

    zarr.Array.__getitem__ = spy
    keys = ("surface_mesh_centers", "surface_normals", "surface_areas", "surface_fields",
            "surface_perm")
    plain = load_shard(store, rank, world, part="surface", keys=keys)
    mesh = init_device_mesh("cpu", (world,))
    st = load_shard(store, rank, world, mesh=mesh, part="surface")
    ds = ShardedRunDataset(root, mesh=mesh, part="surface", keys=keys)
    item = ds[0]
    return {
        "plain": {k: v.numpy() for k, v in plain.items()},
        "st_sizes": list(st["surface_mesh_centers"].sharding_sizes(0)),
        "st_local": st["surface_fields"].to_local().numpy(),
        "ds_perm": item["surface_perm"].to_local().numpy(),
        "vol": load_shard(store, rank, world, part="volume")["volume_fields"].numpy(),
        "stl": load_shard(store, rank, world, part="stl")["stl_faces"].shape,
        "reads": [(n, (s.start, s.stop) if isinstance(s, slice) else repr(s)) for n, s in reads],
    }


def refused_rank(rank: int, world: int, store: str) -> str:
    """The StoreError every rank raises when one rank's rows hold a NaN truth ('' if none)."""
    from meshshard.datasets import load_shard
    from meshshard.store.format import StoreError

    try:
        load_shard(store, rank, world, part="surface")
    except StoreError as exc:
        return str(exc)
    return ""
