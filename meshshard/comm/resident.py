"""Small host data made device-resident once: row offsets, plan indices.

A host list or numpy array turned into a device tensor is a blocking host-to-device copy
(from pageable memory the stream waits for it). The neighbour ops and the ghost refresh need
the same few such tensors at every call of a training step (every rank's row offsets, a halo
plan's send rows), so they are made once per device and reused:

- :func:`device_ints` -- a small int64 vector, cached by its values (LRU, a few hundred);
- :func:`cached_on_device` -- a tensor derived from a long-lived object (a plan), cached on
  that object's identity and dropped when the object is.

The tensors returned are shared: callers must only read them.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["cached_on_device", "device_ints"]

_INTS: OrderedDict[tuple, torch.Tensor] = OrderedDict()
_INTS_MAX = 512
_OWNED: dict[int, dict[tuple, torch.Tensor]] = {}


def device_ints(
    values: Sequence[int], device: torch.device | str, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)``, copied to the device once.

    Read-only: the same tensor is returned to every caller with the same values.
    """
    dev = torch.device(device)
    key = (tuple(int(v) for v in values), dev, dtype)
    t = _INTS.get(key)
    if t is not None:
        _INTS.move_to_end(key)
        return t
    t = torch.tensor(key[0], dtype=dtype).to(dev)
    _INTS[key] = t
    if len(_INTS) > _INTS_MAX:
        _INTS.popitem(last=False)
    return t


def cached_on_device(
    owner: Any,
    key: Hashable,
    device: torch.device | str,
    make: Callable[[], np.ndarray | torch.Tensor],
) -> torch.Tensor:
    """The tensor ``make()`` on ``device``, built once per (``owner``, ``key``, device).

    ``owner`` must be weak-referenceable and immutable in what ``make`` reads (a halo plan):
    the entry lives as long as ``owner`` does. Read-only, like :func:`device_ints`.
    """
    dev = torch.device(device)
    oid = id(owner)
    entries = _OWNED.get(oid)
    if entries is None:
        entries = _OWNED[oid] = {}
        weakref.finalize(owner, _OWNED.pop, oid, None)
    full = (key, dev)
    t = entries.get(full)
    if t is None:
        v = make()
        t = torch.as_tensor(np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v)
        t = entries[full] = t.to(dev)
    return t
