"""Memory measurements shared by the benchmarks and tests: autograd's saved activations
(:func:`saved_activation_bytes`) and this process's resident set -- now (:func:`rss_bytes`),
its high-water mark (:func:`peak_rss_bytes`, :func:`reset_peak_rss`), and the peak seen while
a block runs (:class:`PeakRss`). The RSS readers use Linux's ``/proc/self`` and fall back to
``getrusage`` (a peak that cannot be reset) elsewhere."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["PeakRss", "peak_rss_bytes", "reset_peak_rss", "rss_bytes", "saved_activation_bytes"]

T = TypeVar("T")


def saved_activation_bytes(fn: Callable[[], T]) -> tuple[T, int]:
    """Run ``fn`` and count the bytes of every distinct storage autograd saves for backward
    (each storage once, however many saved tensors view it). Returns ``(fn(), bytes)``."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        for piece in _pieces(t):
            s = piece.untyped_storage()
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def _pieces(t: torch.Tensor):
    """The plain tensors holding ``t``'s data: a wrapper subclass (ShardTensor, DTensor) has no
    storage of its own, its inner tensors do."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        for n in names:
            yield from _pieces(getattr(t, n))
    else:
        yield t


def rss_bytes() -> int:
    """This process's resident set now (``/proc/self/statm``; elsewhere its peak)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's RSS high-water mark (``VmHWM``, which :func:`reset_peak_rss` resets;
    elsewhere ``ru_maxrss``, the peak since the process started)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Set the high-water mark to the current RSS (Linux >= 4.0); False where that is not
    possible (then :func:`peak_rss_bytes` keeps the process's peak)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


class PeakRss:
    """The highest RSS sampled every ``dt`` seconds while the block runs (a thread; torch
    kernels release the GIL, so samples land during the big ops). ``base``: the RSS at entry;
    ``peak``: the largest sample, in bytes. Unlike :func:`peak_rss_bytes` it needs no reset
    and sees only this block, but a peak shorter than ``dt`` can be missed."""

    def __init__(self, dt: float = 0.002) -> None:
        self.dt = dt
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        self.base = self.peak = rss_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.dt)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self) -> int:
        """``peak - base``: what the block added at its highest."""
        return self.peak - self.base
