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
    DeviceMesh over it (collective); alone, a world of one and ``mesh=None``.

    The mesh is a CPU mesh: predict and evaluate read, compute their inputs and run the model
    on the CPU (numpy in, numpy out). On a CUDA host the default group is
    ``cpu:gloo,cuda:nccl`` (:func:`meshshard.comm.process.init`), so the CPU tensors of these
    commands go through gloo rather than raising in NCCL."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    launched = launch().launched
    joined = not dist.is_initialized() and launched
    rank, world = init()
    if joined:
        _OWNED.append(True)
    if world == 1 and not launched:
        return rank, world, None
    if dist.get_backend() == "nccl":  # a group without gloo cannot move these CPU tensors
        msg = ("predict/evaluate run on the CPU: start the group with gloo or "
               "'cpu:gloo,cuda:nccl' (meshshard.comm.init's default), not plain NCCL")
        raise ValueError(msg)
    return rank, world, init_device_mesh("cpu", (world,), mesh_dim_names=("domain",))
