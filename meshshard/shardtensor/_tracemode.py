"""Collectives in a form :func:`meshshard.shardtensor.compile_sharded` can trace.

The sharding rules issue collectives through ``torch.distributed`` (in-place, on real
tensors). While :func:`compile_sharded` traces a model into one graph (AOTAutograd, fake
tensors), nothing may run: every collective must instead become a node of the graph. The
functional collectives (``torch.distributed._functional_collectives``) are such nodes: they
return a new tensor, have fake-tensor rules, and run the same process-group call when the
compiled graph runs. :func:`reduce` and friends pick the functional form while tracing and the
in-place one otherwise; collectives with no traceable form (point-to-point ring shifts,
exchanges whose sizes depend on data) call :func:`refuse`, which raises
:class:`NotTraceableError` while tracing and does nothing otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from meshshard.errors import MeshShardError

__all__ = [
    "NotTraceableError",
    "all_gather",
    "all_to_all_single",
    "constant",
    "keep_collectives",
    "reduce",
    "refuse",
    "tracing",
    "tracing_collectives",
]

_TRACING = [False]
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class NotTraceableError(MeshShardError, RuntimeError):
    """An op on ShardTensors that cannot be part of a :func:`compile_sharded` graph."""


def tracing() -> bool:
    """Whether :func:`compile_sharded` is tracing on this thread's process now."""
    return _TRACING[0]


@contextlib.contextmanager
def tracing_collectives() -> Iterator[None]:
    """Collectives issued inside become graph nodes (see the module docstring)."""
    prior = _TRACING[0]
    _TRACING[0] = True
    try:
        yield
    finally:
        _TRACING[0] = prior


_KEPT = ("all_reduce", "all_gather_into_tensor", "all_to_all_single", "reduce_scatter_tensor",
         "broadcast", "wait_tensor")


@contextlib.contextmanager
def keep_collectives() -> Iterator[None]:
    """Functional collectives count as side-effecting inside: no dead-code pass removes one.

    torch treats them as pure, so a pass drops a collective whose result this rank does not use
    (e.g. an exchange where it receives no rows) while its partners, which do use theirs, still
    run it: they wait forever. Scoped to compile_sharded's tracing and compiling, so other
    graphs in the process are untouched."""
    import torch.fx.node as fx_node

    ops = {getattr(torch.ops._c10d_functional, name).default for name in _KEPT}
    added = ops - fx_node._side_effectful_functions
    fx_node._side_effectful_functions.update(added)
    try:
        yield
    finally:
        fx_node._side_effectful_functions.difference_update(added)


def refuse(what: str) -> None:
    """Raise :class:`NotTraceableError` naming ``what`` while tracing; no-op otherwise."""
    if _TRACING[0]:
        msg = (
            f"compile_sharded cannot put {what} into a compiled graph; run this model eagerly "
            "(or under torch.compile(model), which runs every ShardTensor op eagerly), or "
            "compile its row-local blocks with compile_local"
        )
        raise NotTraceableError(msg)


def constant(data, *, dtype=None, device=None) -> torch.Tensor:
    """``torch.as_tensor`` of values known when the rule runs (numpy arrays, lists): a real
    tensor even while tracing on fake tensors, so that it becomes a constant of the graph (a
    fake one would be an "unexpected fake buffer")."""
    if _TRACING[0]:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return torch.as_tensor(data, dtype=dtype, device=device)
    return torch.as_tensor(data, dtype=dtype, device=device)


def reduce(t: torch.Tensor, op: str, group) -> torch.Tensor:
    """``t`` reduced over ``group`` (``op`` in sum/max/min) as a new tensor; not
    differentiable. Collective."""
    if _TRACING[0]:
        from torch.distributed import _functional_collectives as fc

        return fc.wait_tensor(fc.all_reduce(t.contiguous(), op, group))
    out = t.detach().clone().contiguous()
    dist.all_reduce(out, op=_OPS[op], group=group)
    return out


def all_gather(t: torch.Tensor, n: int, group) -> list[torch.Tensor]:
    """Every rank's ``t`` (same shape everywhere), in rank order. Collective."""
    t = t.contiguous()
    if _TRACING[0]:
        from torch.distributed import _functional_collectives as fc

        out = fc.wait_tensor(fc.all_gather_single(t, 0, group))
        return list(out.view(n, *t.shape).unbind(0))
    bufs = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(bufs, t, group=group)
    return bufs


def all_to_all_single(
    x: torch.Tensor, recv: Sequence[int], send: Sequence[int], group
) -> torch.Tensor:
    """Uneven all-to-all along dim 0: ``send[q]`` rows to rank q, ``recv[q]`` from it."""
    x = x.contiguous()
    recv, send = [int(v) for v in recv], [int(v) for v in send]
    if _TRACING[0]:
        from torch.distributed import _functional_collectives as fc

        return fc.wait_tensor(fc.all_to_all_single(x, recv, send, group))
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x, recv, send, group=group)
    return out
