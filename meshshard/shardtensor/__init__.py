"""Uneven domain-parallel tensors on a torch DeviceMesh.

:class:`ShardTensor` is a wrapper subclass like torch's DTensor (autograd on the wrapper, rules
at the aten level, traceable by plain ``torch.compile``) that records every rank's size of each
sharded dim, so uneven layouts and empty shards survive every op, forward and backward.

Export: :class:`ShardTensor`, torch's :class:`Shard`, :class:`Replicate`, :class:`Partial`,
:func:`from_local`, :func:`scatter`, :func:`redistribute`, :func:`even_sizes`,
:func:`bucket_weight_grads`, :func:`register_rule` (add a sharding rule; its helpers are in
:mod:`meshshard.shardtensor.rules`), and the errors :class:`LayoutError`,
:class:`NoShardingRuleError` and :class:`RuleConflictError`. Design: ``docs/design/core.md``.
"""

from torch.distributed.tensor import Partial, Replicate, Shard

# every op family's rules, one module each (importing one registers its rules; a family that
# extends another's rule imports that module itself, so the order here does not matter)
import meshshard.shardtensor.rules.attention
import meshshard.shardtensor.rules.fallback
import meshshard.shardtensor.rules.graph_rows
import meshshard.shardtensor.rules.graph_scatter
import meshshard.shardtensor.rules.grid_circular
import meshshard.shardtensor.rules.grid_conv
import meshshard.shardtensor.rules.grid_norm
import meshshard.shardtensor.rules.grid_resample
import meshshard.shardtensor.rules.grid_window
import meshshard.shardtensor.rules.index
import meshshard.shardtensor.rules.linalg
import meshshard.shardtensor.rules.norm
import meshshard.shardtensor.rules.pointwise
import meshshard.shardtensor.rules.reduction
import meshshard.shardtensor.rules.shape
import meshshard.shardtensor.rules.slice
import meshshard.shardtensor.rules.tp
import meshshard.shardtensor.rules.values
import meshshard.shardtensor.rules.view  # noqa: F401
from meshshard.errors import LayoutError, NoShardingRuleError
from meshshard.shardtensor._aten import ShardTensor, from_local, redistribute
from meshshard.shardtensor._aten.grad_bucket import bucket_weight_grads
from meshshard.shardtensor._aten.layout_args import even_sizes
from meshshard.shardtensor._aten.registry import RuleConflictError, register_rule
from meshshard.shardtensor._aten.scatter import scatter

__all__ = [
    "LayoutError",
    "NoShardingRuleError",
    "Partial",
    "Replicate",
    "RuleConflictError",
    "Shard",
    "ShardTensor",
    "bucket_weight_grads",
    "even_sizes",
    "from_local",
    "redistribute",
    "register_rule",
    "scatter",
]
