"""Composing domain parallelism with the rest of PyTorch parallelism.

Plans and helpers only (no second tensor type): data parallelism (DDP / FSDP2) over the
``"data"`` mesh dim with ShardTensor inputs sharded over ``"domain"``, and distributed
checkpoints that survive a change of mesh shape.
"""

from meshshard.parallel.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from meshshard.parallel.data import check_same_weights, data_parallel, fsdp_mesh

__all__ = [
    "CheckpointError",
    "check_same_weights",
    "data_parallel",
    "fsdp_mesh",
    "load_checkpoint",
    "save_checkpoint",
]
