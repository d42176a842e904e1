"""Module-level rank functions for the harness tests (they must be picklable)."""

from __future__ import annotations

import os
import time


def allreduce_rank(rank: int, world_size: int) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def backend_name(rank: int, world_size: int) -> str:
    import torch.distributed as dist

    return str(dist.get_backend())


def uneven_all_to_all(rank: int, world_size: int) -> list[float]:
    import torch
    import torch.distributed as dist

    # rank r sends (r + d + 1) values to rank d: uneven splits both ways
    send_sizes = [rank + d + 1 for d in range(world_size)]
    recv_sizes = [s + rank + 1 for s in range(world_size)]
    send = torch.cat([torch.full((n,), float(rank * 10 + d)) for d, n in enumerate(send_sizes)])
    recv = torch.empty(sum(recv_sizes))
    dist.all_to_all_single(recv, send, recv_sizes, send_sizes)
    return recv.tolist()


def fail_on_rank_one(rank: int, world_size: int) -> int:
    import torch
    import torch.distributed as dist

    if rank == 1:
        msg = "deliberate failure on rank 1"
        raise ValueError(msg)
    # the other ranks would block here forever without the harness' kill
    dist.all_reduce(torch.ones(1))
    return rank


def hang(rank: int, world_size: int) -> None:
    time.sleep(600)


def hard_exit(rank: int, world_size: int) -> int:
    if rank == 0:
        os._exit(3)
    time.sleep(600)
    return rank


def echo_args(rank: int, world_size: int, a: int, b: str) -> tuple[int, int, int, str]:
    return rank, world_size, a, b


def make_named_semaphore(rank: int, world_size: int) -> int:
    """Create a multiprocessing lock (a named semaphore the resource tracker follows), as
    numcodecs' blosc does on first use, and keep it alive until the rank exits."""
    import multiprocessing

    global _KEEP
    _KEEP = multiprocessing.get_context("forkserver").Lock()
    return rank


_KEEP = None


def stall_rank_one(rank: int, world_size: int) -> str:
    """Rank 1 stalls before a collective on the group [0, 1]; rank 2 (if any) finishes."""
    import torch
    import torch.distributed as dist

    group = dist.new_group([0, 1])  # every rank makes the group; only 0 and 1 are in it
    if rank >= 2:
        return "finished"
    if rank == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(1), group=group)
    return "unreachable"


def touch_then_sleep(rank: int, world_size: int, flag_dir: str) -> None:
    """Say "I am running" with a file, then sleep (stopped by the parent)."""
    open(os.path.join(flag_dir, f"rank{rank}"), "w").close()
    time.sleep(120)


def private_cache_rank(rank: int, world_size: int) -> tuple[str, bool, bool]:
    """A rank's private inductor cache: set, present while the rank runs."""
    from meshshard.testing.inductor import private_inductor_cache

    path = private_inductor_cache()
    with open(os.path.join(path, "artefact"), "w") as f:  # as inductor would leave one
        f.write("x")
    return path, os.environ["TORCHINDUCTOR_CACHE_DIR"] == path, os.path.isdir(path)


def case_squares(rank: int, world_size: int, cases: list[dict]) -> list[tuple[int, int, int]]:
    """One result per case: (rank, world size, the case's number squared)."""
    return [(rank, world_size, c["n"] ** 2) for c in cases]
