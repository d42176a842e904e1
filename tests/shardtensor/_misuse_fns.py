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
    return out
