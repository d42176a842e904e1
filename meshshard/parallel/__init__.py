"""Composing domain parallelism with the rest of PyTorch parallelism.

Plans and helpers only (no second tensor type): data parallelism (DDP / FSDP2) over the
``"data"`` mesh dim with ShardTensor inputs sharded over ``"domain"``, distributed checkpoints
that survive a change of mesh shape (:mod:`meshshard.parallel.data`,
:mod:`meshshard.parallel.checkpoint`), and tensor parallelism: :mod:`meshshard.parallel.tensor`
(styles, ``parallelize_module``, the 3-D ``("data", "domain", "tensor")`` mesh) with
:mod:`meshshard.parallel.plans` (the Transolver plan).
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
