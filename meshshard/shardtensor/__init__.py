"""Uneven domain-parallel tensors on a torch DeviceMesh.

Export: :class:`ShardTensor`, torch's :class:`Shard`, :class:`Replicate`, :class:`Partial`,
:func:`from_local`, :func:`scatter`, :func:`register_handler`, :func:`allow_gather_fallback`,
:func:`compile_local` (compile the local work of row-local blocks), :func:`compile_sharded`
(compile a whole model, collectives included, per input layout).
"""

from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.shardtensor import handlers as _handlers  # noqa: F401  (registers the rules)
from meshshard.shardtensor._aten import ShardTensor, from_local
from meshshard.shardtensor._dispatch import NoShardingRuleError
from meshshard.shardtensor._fallback import allow_gather_fallback
from meshshard.shardtensor._layout import LayoutError
from meshshard.shardtensor.api import scatter as _scatter_a


def scatter(tensor, mesh, sizes, *, src=0, dim=0, mesh_dim=0):
    st = _scatter_a(tensor, mesh, sizes, src=src, dim=dim, mesh_dim=mesh_dim)
    return from_local(st.to_local(), mesh, st.placements, {mesh_dim: list(st.sharding_sizes(mesh_dim))}, validate=False)
from meshshard.shardtensor.compile import LocalityError, compile_local, compile_local_plan
from meshshard.shardtensor.registry import list_handlers, register_handler, unregister_handler
from meshshard.shardtensor.sharded_compile import NotTraceableError, compile_sharded
from meshshard.shardtensor.spec import ShardSpec

__all__ = [
    "LayoutError",
    "LocalityError",
    "NoShardingRuleError",
    "NotTraceableError",
    "Partial",
    "Replicate",
    "Shard",
    "ShardSpec",
    "ShardTensor",
    "allow_gather_fallback",
    "compile_local",
    "compile_local_plan",
    "compile_sharded",
    "from_local",
    "list_handlers",
    "register_handler",
    "scatter",
    "unregister_handler",
]
