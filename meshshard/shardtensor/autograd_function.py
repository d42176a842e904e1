"""Custom ``torch.autograd.Function``\\ s and tensor hooks on ShardTensors, made exact.

Why this module exists
----------------------
A ShardTensor keeps its autograd graph on the *local* piece (``_local``); the wrapper itself is
created with ``requires_grad=False`` and never gets a ``grad_fn`` in C++. Handlers route every
torch function through ``__torch_function__`` and compute on the locals, so autograd is exact
for ordinary ops. ``torch.autograd.Function.apply`` however is C++ (``THPFunction_apply``) and
never consults ``__torch_function__``: it looks at the *wrapper's* ``requires_grad`` (False),
decides that no input needs a gradient, runs ``forward`` under ``no_grad`` and returns its
output unconnected to the graph. Every gradient that should have flowed through the Function
was silently dropped. FSDP2 applies such a Function to each wrapped module's inputs
(``RegisterPostBackwardFunction``), and DDP does for unused-parameter detection (``_DDPSink``),
so per-block ``fully_shard`` lost the gradients of everything before the last block.

The fix: :func:`install` wraps ``torch.autograd.Function.apply`` once, when the first
ShardTensor is made (not on import; there is no other interception point in torch). A call without
ShardTensor arguments goes straight to torch's ``apply``. A call with ShardTensors runs the user
Function inside a bridge Function on the *local* pieces: the user's ``forward`` and ``backward``
still see ShardTensors (global view, same layouts), ``ctx`` works as usual (``save_for_backward``,
``saved_tensors``, ``needs_input_grad``, ``mark_dirty``, ``mark_non_differentiable``, any
attribute), and gradients flow through the local graph exactly.

``Tensor.register_hook`` on a ShardTensor registers the hook on the local piece; the hook sees
the gradient as a ShardTensor of the same layout and may return a replacement.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import _is_setup_context_defined

from meshshard.shardtensor.api import ShardTensor, _local_of
from meshshard.shardtensor.registry import register_handler

__all__ = ["install"]

_ORIG_APPLY: Any = None


@register_handler(torch.Tensor.register_hook)
def _register_hook(x: ShardTensor, hook: Callable) -> Any:
    """The hook runs on the local gradient, seeing it as a ShardTensor of ``x``'s layout."""
    spec = x._spec

    def local_hook(g: torch.Tensor) -> torch.Tensor | None:
        out = hook(ShardTensor(g, spec))
        if out is None:
            return None
        return _local_of(out, spec)

    return x._local.register_hook(local_hook)


class _Ctx:
    """What the user's ``forward``/``backward`` get as ``ctx``: the bridge's real ctx, with
    ShardTensors mapped to and from their local pieces and ``needs_input_grad`` of the user's
    own inputs."""

    def __init__(self, real: Any, needs_input_grad: tuple[bool, ...]) -> None:
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "needs_input_grad", needs_input_grad)
        object.__setattr__(self, "_saved_specs", None)

    def save_for_backward(self, *tensors: Any) -> None:
        specs = tuple(t._spec if isinstance(t, ShardTensor) else None for t in tensors)
        object.__setattr__(self, "_saved_specs", specs)
        self._real.save_for_backward(
            *(t._local if isinstance(t, ShardTensor) else t for t in tensors)
        )

    @property
    def saved_tensors(self) -> tuple:
        saved = self._real.saved_tensors
        specs = self._saved_specs or (None,) * len(saved)
        return tuple(
            t if s is None or t is None else ShardTensor(t, s) for t, s in zip(saved, specs)
        )

    def mark_dirty(self, *tensors: Any) -> None:
        self._real.mark_dirty(*(_unwrap(t) for t in tensors))

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self._real.mark_non_differentiable(*(_unwrap(t) for t in tensors))

    def set_materialize_grads(self, value: bool) -> None:
        self._real.set_materialize_grads(value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


def _unwrap(t: Any) -> Any:
    return t._local if isinstance(t, ShardTensor) else t


class _Bridge(torch.autograd.Function):
    """Runs a user Function on ShardTensors while autograd sees only the local pieces."""

    @staticmethod
    def forward(ctx: Any, meta: dict, *flat: Any) -> Any:
        cls, specs = meta["cls"], meta["specs"]
        args = [a if s is None else ShardTensor(a, s) for a, s in zip(flat, specs)]
        uctx = _Ctx(ctx, tuple(ctx.needs_input_grad[1:]))
        ctx.meshshard_user_ctx = uctx
        ctx.meshshard_meta = meta
        if meta["setup_context"]:
            out = cls.forward(*args)
            cls.setup_context(uctx, tuple(args), out)
        else:
            out = cls.forward(uctx, *args)
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        meta["single"] = single
        meta["out_specs"] = tuple(o._spec if isinstance(o, ShardTensor) else None for o in outs)
        locs = tuple(_unwrap(o) for o in outs)
        return locs[0] if single else locs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        meta, uctx = ctx.meshshard_meta, ctx.meshshard_user_ctx
        cls, specs = meta["cls"], meta["specs"]
        gs = [g if s is None or g is None else ShardTensor(g, s)
              for g, s in zip(grads, meta["out_specs"])]
        res = cls.backward(uctx, *gs)
        res = res if isinstance(res, tuple) else (res,)
        if len(res) < len(specs):
            msg = (
                f"{cls.__name__}.backward returned {len(res)} gradients for {len(specs)} inputs"
            )
            raise RuntimeError(msg)
        out = []
        for g, s in zip(res[: len(specs)], specs):
            if g is None:
                out.append(g)
            elif s is None:  # a plain input (e.g. a weight): its gradient as a plain tensor
                out.append(g.full_tensor() if isinstance(g, ShardTensor) else g)
            elif isinstance(g, ShardTensor):
                out.append(_local_of(g, s))
            else:
                msg = (
                    f"{cls.__name__}.backward returned a plain tensor of shape {tuple(g.shape)} "
                    f"as the gradient of a ShardTensor input ({s.describe()}); return a "
                    "ShardTensor (e.g. from_local(...) or the incoming grad's layout)"
                )
                raise TypeError(msg)
        return (None, *out)


def _apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    for a in args:  # a plain loop: every autograd Function in the process comes through here
        if isinstance(a, ShardTensor):
            break
    else:
        if not kwargs or not any(isinstance(v, ShardTensor) for v in kwargs.values()):
            return _ORIG_APPLY(cls, *args, **kwargs)
    setup_ctx = _is_setup_context_defined(cls.setup_context)
    if kwargs:
        if not setup_ctx:
            msg = f"{cls.__name__}.apply does not take keyword arguments"
            raise TypeError(msg)
        bound = inspect.signature(cls.forward).bind(*args, **kwargs)
        bound.apply_defaults()
        args = bound.args
    specs = tuple(a._spec if isinstance(a, ShardTensor) else None for a in args)
    meta = {"cls": cls, "specs": specs, "setup_context": setup_ctx}
    out = _ORIG_APPLY(_Bridge, meta, *(_unwrap(a) for a in args))
    outs = (out,) if meta["single"] else out
    wrapped = tuple(
        o if s is None or o is None else ShardTensor(o, s) for o, s in zip(outs, meta["out_specs"])
    )
    return wrapped[0] if meta["single"] else wrapped


def install() -> None:
    """Route ``torch.autograd.Function.apply`` calls with ShardTensor arguments through the
    bridge (idempotent). Calls without ShardTensors are unchanged."""
    global _ORIG_APPLY
    if _ORIG_APPLY is not None:
        return
    _ORIG_APPLY = torch.autograd.Function.apply.__func__
    torch.autograd.Function.apply = classmethod(_apply)  # type: ignore[method-assign]
