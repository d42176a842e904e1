"""Rank functions: distributed checkpoints across mesh shapes, interrupted saves, bad loads."""

from __future__ import annotations

import torch

from tests.parallel._fns import SIZES, model, mse, samples, shard


def _mesh(data: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (data, 2), mesh_dim_names=("data", "domain"))


def _batch_loss(m, mesh, data):
    """Mean of the per-sample losses of the samples this data group holds."""
    d, n = mesh.get_local_rank("data"), mesh.size(0)
    mine = range(d, len(data), n)
    return sum(mse(m, *shard(mesh, data[i], SIZES[i])) for i in mine) / len(mine)


def _step(m, opt, mesh, data):
    opt.zero_grad()
    loss = _batch_loss(m, mesh, data)
    loss.backward()
    opt.step()
    lt = torch.tensor([loss.item()])
    torch.distributed.all_reduce(lt, group=mesh.get_group("data"))
    return lt.item() / mesh.size(0)


def train_save_continue(rank, world_size, path, mode, save_at, steps):
    """2 x 2 mesh: train, save at ``save_at``, keep going (the uninterrupted run)."""
    from meshshard.parallel import data_parallel, save_checkpoint

    mesh = _mesh(2)
    m = data_parallel(model(), mesh, mode=mode)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    data = samples()
    losses = []
    for s in range(steps):
        if s == save_at:
            save_checkpoint(path, m, opt, step=s, extra={"note": "2x2"})
        losses.append(_step(m, opt, mesh, data))
    return losses


def resume(rank, world_size, path, mode, steps):
    """1 x 2 mesh: load the 2 x 2 checkpoint and continue (both samples in one step)."""
    from meshshard.parallel import data_parallel, load_checkpoint

    mesh = _mesh(1)
    m = data_parallel(model(seed=123), mesh, mode=mode)  # other initial weights: overwritten
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    info = load_checkpoint(path, m, opt)
    data = samples()
    losses = [_step(m, opt, mesh, data) for _ in range(info["step"], steps)]
    return {"step": info["step"], "extra": info["extra"], "losses": losses}


def interrupted_save(rank, world_size, path):
    """A save that fails on rank 1 mid-write must leave the last good checkpoint."""
    import torch.distributed.checkpoint as dcp

    from meshshard.parallel import data_parallel, load_checkpoint, save_checkpoint
    from tests.parallel._fns import full_params

    mesh = _mesh(1)
    m = data_parallel(model(), mesh, mode="fsdp")
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    data = samples()
    _step(m, opt, mesh, data)
    save_checkpoint(path, m, opt, step=1)
    good = full_params(m)
    _step(m, opt, mesh, data)
    orig = dcp.FileSystemWriter.write_data

    def failing(self, plan, planner):
        if rank == 1:
            msg = "No space left on device (simulated)"
            raise OSError(msg)
        return orig(self, plan, planner)

    dcp.FileSystemWriter.write_data = failing
    error = None
    try:
        save_checkpoint(path, m, opt, step=2)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        dcp.FileSystemWriter.write_data = orig
    fresh = data_parallel(model(seed=7), mesh, mode="fsdp")
    step = load_checkpoint(path, fresh)["step"]
    same = all(torch.equal(good[n], w) for n, w in full_params(fresh).items())
    # a crash between the two renames leaves only PATH.old: the loader falls back to it
    from pathlib import Path

    torch.distributed.barrier()
    if rank == 0:
        Path(path).rename(Path(str(path) + ".old"))
    torch.distributed.barrier()
    fresh2 = data_parallel(model(seed=8), mesh, mode="fsdp")
    step_old = load_checkpoint(path, fresh2)["step"]
    same_old = all(torch.equal(good[n], w) for n, w in full_params(fresh2).items())
    return {"error": error, "step": step, "same": same, "step_old": step_old,
            "same_old": same_old}


def load_bad(rank, world_size, root, hidden):
    """Load into another model, from a foreign directory, from nowhere: every rank's error."""
    from pathlib import Path

    from meshshard.parallel import data_parallel, load_checkpoint, save_checkpoint

    mesh = _mesh(1)
    save_checkpoint(Path(root) / "ck", data_parallel(model(), mesh, mode="fsdp"), step=0)
    other = data_parallel(model(hidden=hidden), mesh, mode="fsdp")
    errors = []
    for name in ("ck", "foreign", "missing"):
        try:
            load_checkpoint(Path(root) / name, other)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        else:
            errors.append(None)
    return errors


def killed_during_save(rank, world_size, path):
    """Save a good checkpoint at step 1; at step 2 rank 1 dies (os._exit) while writing."""
    import os

    import torch.distributed.checkpoint as dcp

    from meshshard.parallel import data_parallel, save_checkpoint

    mesh = _mesh(1)
    m = data_parallel(model(), mesh, mode="fsdp")
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    data = samples()
    _step(m, opt, mesh, data)
    save_checkpoint(path, m, opt, step=1)
    torch.save(_fns_full(m), f"{path}-weights-{rank}.pt")
    _step(m, opt, mesh, data)
    orig = dcp.FileSystemWriter.write_data

    def dying(self, plan, planner):
        if rank == 1:
            os._exit(3)  # killed mid-save: no exception, no cleanup
        return orig(self, plan, planner)

    dcp.FileSystemWriter.write_data = dying
    save_checkpoint(path, m, opt, step=2)


def _fns_full(m):
    from tests.parallel._fns import full_params

    return full_params(m)


def load_step_and_weights(rank, world_size, path):
    from meshshard.parallel import data_parallel, load_checkpoint

    m = data_parallel(model(seed=5), _mesh(1), mode="fsdp")
    step = load_checkpoint(path, m)["step"]
    return step, _fns_full(m)
