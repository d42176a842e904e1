"""The ShardTensor core: a wrapper subclass with autograd on the wrapper, dispatched at the
aten level. Importing this package registers every rule module (and, through them, the late
functions the tensor class calls: see ``tensor.LATE``). See ``docs/design/core.md``.
"""

from meshshard.shardtensor._aten import (  # noqa: F401  (each registers its rules)
    compiled_outputs,
    engine,
    rules_attention,
    rules_fused,
    rules_generic,
    rules_graph,
    rules_grid,
    rules_grid_circular,
    rules_grid_norm,
    rules_grid_resample,
    rules_grid_window,
    rules_index,
    rules_inplace,
    rules_layernorm,
    rules_logical,
    rules_pyg,
    rules_reduce,
    rules_shape,
    rules_slice,
    rules_softmax,
    rules_tp,
    rules_values,
    rules_view,
)
from meshshard.shardtensor._aten.layout import from_local, redistribute
from meshshard.shardtensor._aten.tensor import ShardTensor, wrap_local

__all__ = ["ShardTensor", "from_local", "redistribute", "wrap_local"]
