"""Controls of the grid rules' halo exchange (conv, pooling, padding, interpolation on grids
sharded along spatial dims).

- :func:`halo_limit` (``max_hops``): refuse plans that would fetch rows from ranks further than
  ``max_hops`` mesh coordinates away (e.g. to keep traffic neighbour-only): a
  :class:`HaloError` on every rank, before any communication, instead of a silent long-range
  fetch. Circular padding counts ring distance.
- :func:`count_halo_bytes`: the bytes of halo rows this rank sends, forward and backward, and
  the number of forward exchanges that moved rows.

Both act on eager execution: under ``torch.compile`` the rules run once, while tracing, and
the limit is checked then; traffic of a compiled graph is not counted. The settings are
process-wide while the block runs (the backward may run on autograd's own threads).

Example::

    with halo_limit(1), count_halo_bytes() as stats:
        conv(x).full_tensor().sum().backward()
    print(stats.forward, stats.backward, stats.calls)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from meshshard.errors import LayoutError

__all__ = ["HaloError", "HaloStats", "count_halo_bytes", "halo_limit"]


class HaloError(LayoutError):
    """A halo cannot be supplied under the current limits (raised on every rank)."""


class HaloStats:
    """Bytes of halo rows sent to other ranks by this rank, forward and backward (the
    backward's reverse exchanges and the input re-fetched for a weight gradient), and
    ``calls``: forward exchanges that moved rows (every rank takes part in each)."""

    def __init__(self) -> None:
        self.forward = 0
        self.backward = 0
        self.calls = 0

    @property
    def total(self) -> int:
        return self.forward + self.backward

    def __repr__(self) -> str:
        return f"HaloStats(forward={self.forward}, backward={self.backward}, calls={self.calls})"


# [max_hops, stats]: read by the grid rules (meshshard.shardtensor._aten.grid_halo)
_STATE: list = [None, None]


def max_hops() -> int | None:
    """The limit of the innermost :func:`halo_limit` block (None: no limit)."""
    return _STATE[0]


def stats() -> HaloStats | None:
    """The counter of the innermost :func:`count_halo_bytes` block (None: not counting)."""
    return _STATE[1]


@contextlib.contextmanager
def halo_limit(max_hops: int | None) -> Iterator[None]:
    """Refuse halo plans that fetch rows from ranks more than ``max_hops`` mesh coordinates
    away (``None``: no limit, the default).

    Raises
    ------
    ValueError
        ``max_hops`` is not None or a non-negative int.
    HaloError
        Inside the block, from a grid op whose rows would come from further away (on every
        rank alike).
    """
    if max_hops is not None and (not isinstance(max_hops, int) or max_hops < 0):
        msg = f"halo_limit: max_hops={max_hops!r} must be None or an int >= 0"
        raise ValueError(msg)
    prev = _STATE[0]
    _STATE[0] = max_hops
    try:
        yield
    finally:
        _STATE[0] = prev


@contextlib.contextmanager
def count_halo_bytes() -> Iterator[HaloStats]:
    """Count the halo bytes this rank sends inside the block (a backward counts when it runs
    inside the block too). Eager execution only."""
    prev = _STATE[1]
    out = HaloStats()
    _STATE[1] = out
    try:
        yield out
    finally:
        _STATE[1] = prev
