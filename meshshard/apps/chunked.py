"""Exact chunked (and domain-parallel) inference for models whose couplings are sums over points.

Which models. A model is covered when every interaction between points goes through a
*reduction module*: a module whose output for a point depends on the other points only through
a sum over all points of some per-point quantity. Everything else in the forward must act on
each point alone (linears, MLPs, LayerNorm over channels, residuals). Transolver is such a
model: its only coupling is Physics-Attention, whose slice tokens and slice-weight sums are
sums over points. Models with kNN/graph message passing (MeshGraphNet), softmax attention among
points (PointTransformer) or grid convolutions (UNet, ViT) are not covered.

A reduction module tells the mechanism how to split itself, in plain torch (no meshshard
import): either it has two methods ``reduction_partial(x) -> Tensor`` (the sums over the points
of ``x``) and ``reduction_finish(x, total) -> Tensor`` (the output for the points of ``x`` given
the sums over all points), as :class:`meshshard.models.PhysicsAttention` has, or an adapter is
registered for its class with :func:`register_reduction`.

How. With R reduction calls per forward, R + 1 passes over the chunks: pass ``k`` runs the
forward on every chunk until the ``k``-th reduction call, which contributes its partial sums and
stops the forward; the ranks then all-reduce the sums (one all-reduce of the sums per pass,
as in the ShardTensor forward), accumulated in float64. Calls before ``k`` use their finished
global sums. The last pass runs every chunk to the end and writes the output. Memory beyond the
inputs and the output: one chunk's activations, whatever the mesh size. Cost: the forward up to
reduction ``k`` is recomputed in pass ``k`` (for Transolver with L layers about (L + 3) / 2
times one forward).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from meshshard.partition.distributed._mem import trim_heap

__all__ = ["ReductionAdapter", "chunked_forward", "reduction_modules", "register_reduction"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReductionAdapter:
    """How a module class splits into per-chunk sums and a finish (see the module notes)."""

    partial: Callable[..., torch.Tensor]
    finish: Callable[..., torch.Tensor]


_ADAPTERS: dict[type, ReductionAdapter] = {}


def register_reduction(cls: type, adapter: ReductionAdapter, *, override: bool = False) -> None:
    """Declare ``cls`` a reduction module: ``adapter.partial(module, *args)`` returns the sums
    over the points of the chunk, ``adapter.finish(module, total, *args)`` the output."""
    if cls in _ADAPTERS and not override:
        msg = f"{cls.__name__} already has a reduction adapter; pass override=True to replace it"
        raise ValueError(msg)
    _ADAPTERS[cls] = adapter


def _adapter(m: nn.Module) -> ReductionAdapter | None:
    for cls in type(m).__mro__:
        if cls in _ADAPTERS:
            return _ADAPTERS[cls]
    if callable(getattr(m, "reduction_partial", None)) and callable(
        getattr(m, "reduction_finish", None)
    ):
        return ReductionAdapter(lambda mod, *a: mod.reduction_partial(*a),
                                lambda mod, total, *a: mod.reduction_finish(*a, total))
    return None


def reduction_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The reduction modules of ``model`` (name, module), outermost first."""
    return [(n, m) for n, m in model.named_modules() if _adapter(m) is not None]


class _Reached(Exception):
    pass


class _Pass:
    def __init__(self, totals: list[torch.Tensor], stop_at: int | None) -> None:
        self.totals, self.stop_at = totals, stop_at
        self.calls = 0
        self.partial: torch.Tensor | None = None


@contextmanager
def _patched(model: nn.Module, state: _Pass):
    saved = []
    for _, m in reduction_modules(model):
        ad = _adapter(m)

        def fwd(*args, _m=m, _ad=ad, **kw):
            if kw:
                msg = f"{type(_m).__name__}: chunked inference passes positional inputs only"
                raise TypeError(msg)
            i = state.calls
            state.calls += 1
            if i < len(state.totals):
                return _ad.finish(_m, state.totals[i].to(args[0].dtype), *args)
            if i == state.stop_at:
                state.partial = _ad.partial(_m, *args)
                raise _Reached
            msg = (
                "chunked_forward: reduction calls differ between chunks (data-dependent "
                "control flow?)"
            )
            raise RuntimeError(msg)

        saved.append((m, m.__dict__.get("forward")))
        m.forward = fwd
    try:
        yield
    finally:
        for m, old in saved:
            if old is None:
                del m.forward
            else:
                m.forward = old


def _all_reduce(t: torch.Tensor, group: Any) -> torch.Tensor:
    import torch.distributed as dist

    if group is False or not (dist.is_available() and dist.is_initialized()):
        return t
    if dist.get_world_size(group) == 1:
        return t
    dev = t.device
    if dist.get_backend(group) == "nccl" and dev.type != "cuda":
        t = t.cuda()
    dist.all_reduce(t, group=group)
    return t.to(dev)


def chunked_forward(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    *,
    max_points_per_chunk: int,
    dim: int = 1,
    group: Any = None,
    out: torch.Tensor | None = None,
    release: bool = False,
) -> torch.Tensor:
    """``model(*inputs)`` computed ``max_points_per_chunk`` points at a time, exactly.

    Collective when ``torch.distributed`` is initialised: every rank of ``group`` passes its own
    points (any number, zero included) and gets the output for them; the result equals the
    model on the points of all ranks together. Pass ``group=False`` for one process only.

    Parameters
    ----------
    model : nn.Module
        A model covered by the mechanism (see the module notes); run under ``no_grad``.
    inputs : sequence of Tensor, each (B, n, ...) with the points along ``dim``
        Plain (local) tensors.
    max_points_per_chunk : int
        Points per chunk (>= 1).
    out : Tensor, optional
        Where to write the output (B, n, C); allocated at the first chunk otherwise.
    release : bool
        Hand the heap pages freed by each chunk back to the OS after it (glibc's
        ``malloc_trim``; a no-op elsewhere), so that the resident set does not keep every
        chunk's freed activations. The results do not change.

    Raises
    ------
    ValueError
        Bad chunk size, inputs with different point counts, or ranks that disagree on the
        number of reductions.
    """
    if max_points_per_chunk < 1:
        msg = f"max_points_per_chunk={max_points_per_chunk} must be >= 1"
        raise ValueError(msg)
    if not inputs:
        msg = "chunked_forward needs at least one input tensor"
        raise ValueError(msg)
    n = int(inputs[0].shape[dim])
    if any(int(x.shape[dim]) != n for x in inputs):
        msg = f"inputs have different point counts along dim {dim}: {[x.shape for x in inputs]}"
        raise ValueError(msg)
    if not reduction_modules(model):
        log.warning("chunked_forward: %s has no reduction modules; each chunk runs alone",
                    type(model).__name__)
    c = int(max_points_per_chunk)
    bounds = [(a, min(a + c, n)) for a in range(0, n, c)] or [(0, 0)]
    totals: list[torch.Tensor] = []
    with torch.no_grad():
        while True:
            k = len(totals)
            acc: torch.Tensor | None = None
            reached = 0
            for a, b in bounds:
                chunk = [x.narrow(dim, a, b - a) for x in inputs]
                state = _Pass(totals, k)
                with _patched(model, state):
                    try:
                        y = model(*chunk)
                    except _Reached:
                        y = None
                if y is None:
                    reached += 1
                    p = state.partial.double()
                    acc = p if acc is None else acc + p
                    if release:
                        del p, state, chunk
                        trim_heap()
                    continue
                if out is None:
                    shape = list(y.shape)
                    shape[dim] = n
                    out = torch.empty(shape, dtype=y.dtype, device=y.device)
                out.narrow(dim, a, b - a).copy_(y)
                if release:
                    del y, chunk
                    trim_heap()
            if reached not in (0, len(bounds)):
                msg = "chunked_forward: some chunks reached a reduction and others did not"
                raise RuntimeError(msg)
            done = reached == 0
            size = 0 if done else acc.numel()
            flag = _all_reduce(torch.tensor([1.0 - done, float(size), 1.0]), group)
            if float(flag[0]) not in (0.0, float(flag[2])) or float(flag[1]) != size * float(
                flag[0]
            ):
                msg = (
                    "chunked_forward: ranks disagree on the model's reductions (another rank "
                    f"is at reduction {k} with other sizes); do all ranks run the same model?"
                )
                raise ValueError(msg)
            if done:
                return out
            totals.append(_all_reduce(acc, group))
