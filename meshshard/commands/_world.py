"""The process world of a command that may run under torchrun (predict, evaluate)."""

from __future__ import annotations

from typing import Any

from meshshard.comm.launch import launch
from meshshard.comm.process import init, shutdown

_OWNED: list[bool] = []


def leave_world(code: int) -> int:
    """After a command under torchrun that joined the group itself: tear the groups down and
    leave at once (:func:`meshshard.comm.process.shutdown`; gloo may abort in the interpreter's
    teardown otherwise). Elsewhere (tests, a caller's own group) it returns ``code``."""
    if _OWNED:
        shutdown(exit_code=code)
    return code


def join_world() -> tuple[int, int, Any]:
    """``(rank, world, mesh)``: under torchrun (``RANK`` set) join the group and build a 1-D
    CPU/CUDA DeviceMesh over it (collective); alone, a world of one and ``mesh=None``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    launched = launch().launched
    joined = not dist.is_initialized() and launched
    rank, world = init()
    if joined:
        _OWNED.append(True)
    if world == 1 and not launched:
        return rank, world, None
    dev = "cuda" if dist.get_backend() == "nccl" and torch.cuda.is_available() else "cpu"
    return rank, world, init_device_mesh(dev, (world,), mesh_dim_names=("domain",))
