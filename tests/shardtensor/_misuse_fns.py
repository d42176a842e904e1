"""Rank functions: one rank (the last) misuses ``from_local`` while the others call it right;
every rank must raise the same error at once (a long collective timeout would show a hang)."""

from __future__ import annotations

import time

import torch


def _cases(rank: int, ws: int) -> dict:
    """name -> (local, placements, sharding_shapes) for this rank; the last rank is at fault."""
    from meshshard.shardtensor import Partial, Replicate, Shard

    sizes = [3, 5, 2][:ws]
    good = (torch.randn(sizes[rank], 4), [Shard(0)], list(sizes))
    last = rank == ws - 1
    x = good[0]

    def odd(local=None, placements=None, shapes=None, keep_shapes=True) -> tuple:
        if not last:
            return good
        return (x if local is None else local, good[1] if placements is None else placements,
                good[2] if shapes is None and keep_shapes else shapes)

    short = torch.Size([sizes[rank]] + [1] * 16)
    return {
        "sizes of the wrong length": odd(shapes=list(sizes) + [1]),
        "a negative size": odd(shapes={0: tuple(sizes[:-1]) + (-1,)}),
        "a string": odd(shapes="3,5"),
        "a 17-dim piece shape": odd(shapes=[short] * ws),
        "Replicate where the others Shard(0)": odd(placements=[Replicate()], keep_shapes=False),
        "Shard(1) where the others Shard(0)": odd(placements=[Shard(1)], keep_shapes=False),
        "Partial('max') where the others Shard(0)": odd(placements=[Partial("max")],
                                                       keep_shapes=False),
        "float64 among float32": odd(local=x.double()),
        "int64 among float32": odd(local=x.long()),
        "a 3-d piece among 2-d": odd(local=x[:, :, None]),
        "trailing dim 5 among 4": odd(local=torch.randn(sizes[rank], 5)),
        "a meta piece among cpu": odd(local=x.to("meta")),
        "not a tensor": odd(local=x.tolist()),
        "a piece of 17 dims": odd(local=x[:, :1].reshape(short)),
    }


def misuse(rank: int, ws: int) -> dict:
    """Every case of :func:`_cases` in one spawn: (exception type, message, seconds) per case,
    or None where nothing was raised. Then a right call, which must still work on every rank
    (every rank ran the same exchanges, so none is left behind)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", (ws,))
    out = {}
    for name, (local, placements, shapes) in _cases(rank, ws).items():
        t = time.monotonic()
        try:
            from_local(local, mesh, placements, shapes)
            out[name] = None
        except Exception as exc:  # the type is part of what is checked
            out[name] = (type(exc).__name__, str(exc), time.monotonic() - t)
    sizes = [3, 5, 2][:ws]
    a = from_local(torch.full((sizes[rank], 2), float(rank)), mesh, [Shard(0)])
    out["after"] = (a.sharding_sizes(), a.full_tensor().sum().item())
    out["collectives"] = _collectives(rank, mesh, sizes)
    return out


def _collectives(rank: int, mesh, sizes: list) -> dict:
    """Collectives (torch's profiler: gloo's own events) of one right call in each form."""
    from torch.profiler import ProfilerActivity, profile

    from meshshard.shardtensor import Partial, Replicate, Shard, from_local

    piece, same = torch.ones(sizes[rank], 2), torch.ones(2, 2)
    calls = {
        "Shard, sizes given": lambda: from_local(piece, mesh, [Shard(0)], sizes),
        "Shard, sizes inferred": lambda: from_local(piece, mesh, [Shard(0)]),
        "Replicate": lambda: from_local(same, mesh, [Replicate()]),
        "Partial": lambda: from_local(same, mesh, [Partial()]),
        "Shard, sizes given, validate=False": lambda: from_local(piece, mesh, [Shard(0)], sizes,
                                                                 validate=False),
        "Shard, sizes inferred, validate=False": lambda: from_local(piece, mesh, [Shard(0)],
                                                                    validate=False),
        "Replicate, validate=False": lambda: from_local(same, mesh, [Replicate()],
                                                        validate=False),
    }
    out = {}
    for name, call in calls.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            call()
        out[name] = sum(e.count for e in prof.key_averages() if e.key.startswith("c10d::"))
    return out


def misuse_2d(rank: int, ws: int) -> dict:
    """A 2 x 2 mesh (ranks 0..3 at coordinates (0, 0), (0, 1), (1, 0), (1, 1)): right calls
    give the inferred sizes; each wrong one on rank 3 (or rank 0) must reach all four ranks,
    also those that share no mesh group with the rank at fault."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Replicate, Shard, from_local

    mesh = init_device_mesh("cpu", (2, 2))
    c0, c1 = divmod(rank, 2)
    rows, cols = (3, 5)[c0], (2, 4)[c1]
    out = {}
    a = from_local(torch.ones(rows, cols), mesh, [Shard(0), Shard(1)])
    b = from_local(torch.ones(rows, 6), mesh, [Shard(0), Replicate()])
    out["right"] = (a._spec.sizes, tuple(a.shape), b._spec.sizes, tuple(b.shape))
    cases = {
        "rows differ at one coordinate": (torch.ones(rows + (rank == 3), 6),
                                          [Shard(0), Replicate()]),
        "placements differ on rank 3": (torch.ones(rows, cols), [Shard(0), Shard(1)] if rank != 3
                                        else [Shard(0), Replicate()]),
        "dtype differs on rank 0": (torch.ones(rows, cols, dtype=torch.float64 if rank == 0
                                               else torch.float32), [Shard(0), Shard(1)]),
    }
    for name, (local, placements) in cases.items():
        t = time.monotonic()
        try:
            from_local(local, mesh, placements)
            out[name] = None
        except Exception as exc:  # the type is part of what is checked
            out[name] = (type(exc).__name__, str(exc), time.monotonic() - t)
    return out
