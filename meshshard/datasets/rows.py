"""One rank's rows as tensors: the wrapping both store readers share.

:func:`~meshshard.datasets.load_shard` (meshshard's stores) and
:func:`~meshshard.datasets.curator.load_curator_shard` (physicsnemo-curator stores) end the
same way: numpy rows become tensors on a device, ShardTensors on a mesh. The loader dispatches
to the curator reader, so these live below both of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshshard.shardtensor import Shard, from_local

__all__ = ["target_device", "wrap_rows"]


def target_device(mesh: Any, device: Any):
    """``device`` when given, else the mesh's device type (the current CUDA device for
    ``"cuda"``), else CPU."""
    import torch

    if device is not None:
        return torch.device(device)
    if mesh is not None and mesh.device_type != "cpu":
        return torch.device(mesh.device_type, torch.cuda.current_device())
    return torch.device("cpu")


def wrap_rows(rows: dict[str, np.ndarray], mesh: Any, sizes: Any, dev: Any) -> dict[str, Any]:
    """This rank's rows of each array as tensors on ``dev``: ShardTensors sharded on dim 0 with
    every rank's ``sizes`` on a ``mesh``, or plain tensors plus ``sharding_sizes`` without one.
    No collective: every rank derives the same sizes, so no shape all-gather is needed."""
    import torch

    out: dict[str, Any] = {}
    for k, arr in rows.items():
        local = torch.from_numpy(np.ascontiguousarray(arr)).to(dev)
        if mesh is None:
            out[k] = local
        else:
            out[k] = from_local(local, mesh, [Shard(0)], sharding_shapes=sizes, validate=False)
    if mesh is None:
        out["sharding_sizes"] = torch.tensor(sizes, dtype=torch.int64)
    return out
