"""The process world of a command that may run under torchrun (predict, evaluate)."""

from __future__ import annotations

import os
from typing import Any


def join_world() -> tuple[int, int, Any]:
    """``(rank, world, mesh)``: under torchrun (``RANK`` set) join the group and build a 1-D
    CPU/CUDA DeviceMesh over it (collective); alone, a world of one and ``mesh=None``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.distributed import init

    rank, world = init()
    if world == 1 and "RANK" not in os.environ:
        return rank, world, None
    dev = "cuda" if dist.get_backend() == "nccl" and torch.cuda.is_available() else "cpu"
    return rank, world, init_device_mesh(dev, (world,), mesh_dim_names=("domain",))
