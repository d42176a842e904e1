"""Rank functions for the diverging-ranks tests (module level: they must be picklable)."""

from __future__ import annotations


def _sample(rank: int, world_size: int, core: bool = False):
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    if core:  # the new core (issue 22): its collectives make the same checks
        from meshshard.shardtensor._aten import from_local

    mesh = init_device_mesh("cpu", (world_size,))
    sizes = [3 + r for r in range(world_size)]  # uneven shards
    local = torch.arange(sizes[rank] * 2, dtype=torch.float32).reshape(-1, 2) + rank
    x = from_local(local, mesh, [Shard(0)], sharding_shapes=sizes)
    return x, (x**2).sum()  # the sum over the sharded dim is Partial


def only_rank0_item(loss) -> float:
    return loss.item()  # collective: the Partial loss is all-reduced


def everyone_gathers(x):
    return x.full_tensor()


def other_item(loss) -> float:
    return loss.item()


def _grid(rank: int, world_size: int, core: bool = False):
    """A (1, 1, H, 2) grid sharded along H (uneven, one empty slab when there are 3+ ranks),
    the leaf of this rank's piece, and the whole grid."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    if core:
        from meshshard.shardtensor._aten import from_local

    mesh = init_device_mesh("cpu", (world_size,))
    sizes = [2, 0, *range(3, world_size + 1)] if world_size > 2 else [2, 3][:world_size]
    full = torch.arange(sum(sizes) * 2, dtype=torch.float32).reshape(1, 1, -1, 2)
    off = sum(sizes[:rank])
    leaf = full[:, :, off : off + sizes[rank]].clone().requires_grad_()
    return from_local(leaf, mesh, [Shard(2)], sharding_shapes=sizes), leaf, full, off


def halo_conv(grid):
    import torch
    import torch.nn.functional as F

    w = torch.arange(9.0).reshape(1, 1, 3, 3) / 9  # rows cross the cuts: the grid halo
    return F.conv2d(grid, w, padding=1)


def _caught(call):
    from meshshard.comm.process import CollectiveMismatchError

    try:
        call()
    except CollectiveMismatchError as exc:
        return {"message": str(exc), "differing": exc.differing, "calls": exc.calls}
    return None


def debug_cases(rank: int, world_size: int, core: bool = False) -> dict:
    """With MESHSHARD_DEBUG_COLLECTIVES=1: each case diverges (or not) and every rank returns
    what it saw; a mismatch leaves the ranks in step, so the next case runs on."""
    from meshshard.comm.process import check_collective, debug_enabled

    out: dict = {"debug": debug_enabled()}
    x, loss = _sample(rank, world_size, core)

    def item_vs_gather():  # rank 0 reduces the Partial loss alone; the others go on
        if rank == 0:
            only_rank0_item(loss)
        everyone_gathers(x)

    out["item_vs_gather"] = _caught(item_vs_gather)

    def same_op_other_line():  # same op, dtype and shape; only the caller's line differs
        if rank == 0:
            only_rank0_item(loss)
        else:
            other_item(loss)

    out["same_op_other_line"] = _caught(same_op_other_line)
    grid, leaf, full, off = _grid(rank, world_size, core)

    def halo_vs_gather():  # rank 0 convolves (the grid halo's all-to-all); the others gather
        if rank == 0:
            halo_conv(grid)
        everyone_gathers(x)

    out["halo_vs_gather"] = _caught(halo_vs_gather)
    # matching halo exchanges (forward and the gradients back) pass and stay exact
    y = halo_conv(grid)
    y.full_tensor().sum().backward()
    ref = full.clone().requires_grad_()
    want = halo_conv(ref)
    want.sum().backward()
    out["halo_matching"] = (y.full_tensor().detach(), want.detach(), leaf.grad,
                            ref.grad[:, :, off : off + leaf.shape[2]])
    # matching calls still work, with the right values, after the mismatches
    out["full"] = everyone_gathers(x).tolist()
    out["loss"] = only_rank0_item(loss)
    import torch

    w = torch.ones(2, requires_grad=True)  # replicated weight: its gradient is all-reduced
    (x * w).sum().backward()
    out["grad"] = w.grad.tolist()
    out["check_alone_when_matching"] = _caught(lambda: check_collective("custom", detail="ok"))
    return out


def debug_off_is_local(rank: int, world_size: int) -> float:
    """Debug mode off: a check made by rank 0 alone communicates nothing (else the all_reduce
    below would pair with it and hang or give a wrong sum)."""
    import torch
    import torch.distributed as dist

    from meshshard.comm.process import check_collective, debug_enabled

    assert not debug_enabled()
    if rank == 0:
        for _ in range(3):
            check_collective("all_reduce", None, torch.ones(1), detail="rank 0 only")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def item_on_rank0_only(rank: int, world_size: int) -> None:
    """The classic divergence without debug mode: rank 0 reduces a Partial loss alone."""
    x, loss = _sample(rank, world_size)
    if rank == 0:
        only_rank0_item(loss)
    everyone_gathers(x)
