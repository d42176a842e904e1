"""Small constant tensors (a grid's origin, spacing and shape; cut boundaries) made once per
device and dtype and reused: building them from host data at every call is a host-to-device
copy (a host sync on a GPU) in the step. Callers must not change them in place."""

from __future__ import annotations

from functools import lru_cache

import torch

__all__ = ["device_const"]


@lru_cache(maxsize=256)
def _make(values: tuple, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def device_const(values, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)``, made once and cached (read-only
    by contract). ``values``: numbers, or a sequence of them."""
    key = tuple(float(v) if dtype.is_floating_point else int(v) for v in values)
    return _make(key, dtype, str(torch.device(device)))
