"""Count host syncs per call, and say which meshshard line made each one.

A host sync is any place where the host must wait for the device: a scalar read back
(``.item()``, ``int()``/``float()``/``bool()`` of a tensor, ``torch.equal``), a tensor turned
into host data (``.tolist()``, ``.numpy()``), an op whose output size depends on the data
(``nonzero``, ``unique``, ``masked_select``, a boolean-mask index, ``repeat_interleave``
without ``output_size``, ``bincount``) and a tensor built from host data (``torch.tensor``,
``torch.as_tensor`` of a list or array, ``torch.from_numpy``: a host-to-device copy on a GPU).

On a GPU these stall the stream; on a CPU they cost nothing, which is why the census counts
the *op*, not the wait: it works on the CPU (and over gloo) and gives the number a GPU run
would pay. Each event is attributed to the innermost stack frame inside the ``meshshard``
package (not this module), so ``by_line()`` points at the code to change.

Example
-------
>>> import torch
>>> from meshshard.testing.sync_census import sync_census
>>> x = torch.arange(6.0)
>>> with sync_census() as c:
...     n = int((x > 2).sum())
...     y = x[x > 2]
>>> c.total, sorted(c.by_kind())
(2, ['bool_index', 'item'])
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SyncCensus", "SyncEvent", "sync_census"]

aten = torch.ops.aten

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../meshshard
_THIS_FILE = os.path.abspath(__file__)

# aten overload packets -> kind. Output size depends on the data, or a scalar comes back.
_ALWAYS: dict[object, str] = {
    aten._local_scalar_dense: "item",
    aten.equal: "item",
    aten.allclose: "item",
    aten.is_nonzero: "item",
    aten.nonzero: "nonzero",
    aten.argwhere: "nonzero",
    aten._unique: "unique",
    aten._unique2: "unique",
    aten.unique_dim: "unique",
    aten.unique_consecutive: "unique",
    aten.masked_select: "masked_select",
    aten.bincount: "bincount",
    aten.lift_fresh: "host_tensor",
}


@dataclass(frozen=True)
class SyncEvent:
    """One host sync: its ``kind`` (``item``, ``tolist``, ``numpy``, ``nonzero``, ``unique``,
    ``masked_select``, ``bool_index``, ``repeat_interleave``, ``bincount``, ``host_tensor``),
    the ``op`` that made it, and ``where``: ``"meshshard/ops/api.py:123"`` or ``"<outside>"``."""

    kind: str
    op: str
    where: str


@dataclass(eq=False)
class SyncCensus:
    """The events counted inside one ``with sync_census() as c:`` block."""

    events: list[SyncEvent] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Number of host syncs counted."""
        return len(self.events)

    def by_line(self) -> dict[str, int]:
        """``{"meshshard/<file>.py:<line>": count}``, most frequent first."""
        return dict(Counter(e.where for e in self.events).most_common())

    def by_kind(self) -> dict[str, int]:
        """``{kind: count}``, most frequent first."""
        return dict(Counter(e.kind for e in self.events).most_common())

    def count(self, kind: str | None = None, where: str | None = None) -> int:
        """Events of one ``kind`` and/or from lines whose location contains ``where``."""
        return sum(
            1
            for e in self.events
            if (kind is None or e.kind == kind) and (where is None or where in e.where)
        )

    def report(self) -> str:
        """A few lines for a failing test's message: the total, then each line's count and kinds."""
        per: dict[str, Counter] = {}
        for e in self.events:
            per.setdefault(e.where, Counter())[e.kind] += 1
        rows = sorted(per.items(), key=lambda kv: -sum(kv[1].values()))
        lines = [f"{self.total} host syncs"]
        lines += [f"  {sum(c.values()):4d}  {w}  {dict(c)}" for w, c in rows]
        return "\n".join(lines)


def _where() -> str:
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith(_PKG_DIR) and fn != _THIS_FILE:
            rel = os.path.relpath(fn, os.path.dirname(_PKG_DIR))
            return f"{rel}:{f.f_lineno}"
        f = f.f_back
    return "<outside>"


def _is_bool_index(indices) -> bool:
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()
    )


def _kind(func, args, kwargs) -> str | None:
    packet = func.overloadpacket
    kind = _ALWAYS.get(packet)
    if kind is not None:
        return kind
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        idx = args[1] if len(args) > 1 else kwargs.get("indices")
        return "bool_index" if _is_bool_index(idx) else None
    if packet is aten.repeat_interleave:
        if func is aten.repeat_interleave.self_int:
            return None
        if kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None):
            return "repeat_interleave"
    return None


_state = threading.local()


def _active() -> list[SyncCensus]:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    return stack


def _record(kind: str, op: str, where: str) -> None:
    ev = SyncEvent(kind, op, where)
    for c in _active():
        c.events.append(ev)


class _Mode(TorchDispatchMode):
    """Each open census has its own mode; an op passes through every mode on the stack, so a
    mode records into its own census only."""

    def __init__(self, census: SyncCensus) -> None:
        super().__init__()
        self.census = census

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # A tensor subclass (ShardTensor) runs its own dispatch first, so that the plain-tensor
        # ops it issues are the ones seen and counted (once each).
        if any(t is not torch.Tensor and t is not torch.nn.Parameter for t in types):
            return NotImplemented
        if not getattr(_state, "inside_host_call", False):
            kind = _kind(func, args, kwargs)
            if kind is not None:
                self.census.events.append(SyncEvent(kind, str(func), _where()))
        return func(*args, **kwargs)


def _wrap_host_method(name: str, kind: str):
    orig = getattr(torch.Tensor, name)

    def wrapper(self, *args, **kwargs):
        if getattr(_state, "inside_host_call", False) or not _active():
            return orig(self, *args, **kwargs)
        _record(kind, f"Tensor.{name}", _where())
        _state.inside_host_call = True
        try:
            return orig(self, *args, **kwargs)
        finally:
            _state.inside_host_call = False

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    return orig, wrapper


_patch_lock = threading.Lock()
_patch_depth = 0
_originals: dict[str, object] = {}


def _patch() -> None:
    global _patch_depth
    with _patch_lock:
        if _patch_depth == 0:
            for name, kind in (("tolist", "tolist"), ("numpy", "numpy")):
                orig, wrapper = _wrap_host_method(name, kind)
                _originals[name] = orig
                setattr(torch.Tensor, name, wrapper)
        _patch_depth += 1


def _unpatch() -> None:
    global _patch_depth
    with _patch_lock:
        _patch_depth -= 1
        if _patch_depth == 0:
            for name, orig in _originals.items():
                setattr(torch.Tensor, name, orig)
            _originals.clear()


@contextmanager
def sync_census() -> Iterator[SyncCensus]:
    """Count the host syncs made inside the block, on this thread (and in autograd's backward
    run from it).

    Yields a :class:`SyncCensus`; read ``c.total``, ``c.by_line()``, ``c.by_kind()`` or
    ``c.report()`` after (or during) the block. Blocks nest: an event counts in every open census.
    ``Tensor.tolist`` and ``Tensor.numpy`` are wrapped while a census is open (they read memory
    without going through torch's dispatcher) and restored when the last one closes.
    """
    census = SyncCensus()
    _patch()
    _active().append(census)
    try:
        with _Mode(census):
            yield census
    finally:
        _active().remove(census)
        _unpatch()
