"""Count point-to-point sends and receives, grouped (inside ``batch_isend_irecv``) or not.

NCCL matches point-to-point messages by post order and can deadlock on a send and a receive
to the same peer posted apart (at two ranks a ring's predecessor and successor are one peer);
gloo hides both. meshshard posts every p2p message through ``batch_isend_irecv``: this counter
proves it on gloo. It wraps ``torch.distributed``'s ``isend``/``irecv``/``batch_isend_irecv``
with pass-through functions (the messages still travel; nothing is mocked) for the duration of
a ``with`` block in this process.

Example
-------
>>> with P2PCensus() as c:  # doctest: +SKIP
...     ring_attention_step()
>>> c.ungrouped  # doctest: +SKIP
0
"""

from __future__ import annotations

import functools

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = ["P2PCensus"]


class P2PCensus:
    """Counts of p2p calls made while the block runs.

    Attributes
    ----------
    grouped : int
        ``isend``/``irecv`` posted inside a ``batch_isend_irecv``.
    ungrouped : int
        ``isend``/``irecv`` (and blocking ``send``/``recv``) posted on their own.
    batches : int
        ``batch_isend_irecv`` calls.
    """

    def __init__(self) -> None:
        self.grouped = 0
        self.ungrouped = 0
        self.batches = 0
        self._depth = 0
        self._saved: list[tuple[object, str, object]] = []

    def _p2p(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if self._depth:
                self.grouped += 1
            else:
                self.ungrouped += 1
            return fn(*args, **kwargs)

        return wrapper

    def _batch(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self.batches += 1
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return wrapper

    def __enter__(self) -> P2PCensus:
        # torch's batch_isend_irecv and P2POp compare ``op is isend`` against c10d's globals,
        # so the same wrapper must stand in both namespaces
        wrapped = {}
        for name in ("isend", "irecv", "send", "recv"):
            wrapped[name] = self._p2p(getattr(c10d, name))
        wrapped["batch_isend_irecv"] = self._batch(c10d.batch_isend_irecv)
        for mod in (c10d, dist):
            for name, new in wrapped.items():
                self._saved.append((mod, name, getattr(mod, name)))
                setattr(mod, name, new)
        return self

    def __exit__(self, *exc) -> None:
        for mod, name, old in reversed(self._saved):
            setattr(mod, name, old)
        self._saved.clear()
