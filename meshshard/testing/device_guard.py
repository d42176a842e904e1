"""Prove a training step device-resident without the device: every tensor on one device.

A CUDA step fails on the first CPU tensor that meets a device tensor or enters a NCCL
collective. This machine has no GPU, but the *meta* device stands in for it: build the model and
the inputs on ``meta``, join a fake process group (:func:`fake_world`: torch's ``"fake"``
backend, collectives that move nothing), and run the step under :class:`DeviceGuard`, which
raises on the first aten op whose arguments or results hold a tensor on another device -- a
tensor built on the host (``torch.tensor(...)``, ``torch.arange(n)`` without ``device=``,
``from_numpy``) that would be a CPU tensor on a GPU run too. It also looks inside tensor
subclasses (a ShardTensor's rules run their local ops under it), and names the meshshard line
that made the op.

Meta tensors have no values, so code that reads a value back (a size, ``.item()``) cannot run on
them: such a path needs a value-free form to be checked this way.

Example
-------
>>> with fake_world(2, rank=0), DeviceGuard("meta"):  # doctest: +SKIP
...     loss = model(x_meta).sum(); loss.backward()
"""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from meshshard.comm.process import fake_world

__all__ = ["DeviceGuard", "WrongDeviceError", "fake_world"]


class WrongDeviceError(RuntimeError):
    """A tensor on another device met the step (the op, the device and the meshshard line)."""


def _where() -> str:
    frames = [f for f in traceback.extract_stack()[:-2]
              if "meshshard" in f.filename and "device_guard" not in f.filename]
    if not frames:
        return "outside meshshard"
    f = frames[-1]
    return f"{f.filename.split('meshshard/', 1)[-1]}:{f.lineno} ({f.line})"


class DeviceGuard(TorchDispatchMode):
    """Raise :class:`WrongDeviceError` on the first aten op with a tensor argument or result
    not on ``device`` (plain tensors; subclasses are checked through the ops they run). Meta
    tensors are let through on a real device: they hold no data (shape inference).

    Parameters
    ----------
    device : str or torch.device
        The one device every tensor must live on (``"meta"`` for a CPU proxy run).
    """

    def __init__(self, device: str | torch.device = "meta") -> None:
        super().__init__()
        self.device = torch.device(device)
        self.allowed = {self.device.type, "meta"}
        self.ops = 0

    def _check(self, func, what: str, values) -> None:
        for t in tree_leaves(values):
            if isinstance(t, torch.Tensor) and t.device.type not in self.allowed:
                msg = (f"{func}: {what} on {t.device} (shape {tuple(t.shape)}, {t.dtype}), "
                       f"not {self.device}; made at {_where()}")
                raise WrongDeviceError(msg)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(t is not torch.Tensor for t in types):
            return NotImplemented  # the subclass runs its rule; its local ops come back here
        self.ops += 1
        self._check(func, "an argument", (args, kwargs))
        out = func(*args, **kwargs)
        self._check(func, "its result", out)
        return out
