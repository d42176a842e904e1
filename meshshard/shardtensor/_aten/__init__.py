"""Issue 22: a ShardTensor with autograd on the wrapper, dispatched at aten level.

Not exported yet (today's :class:`meshshard.shardtensor.ShardTensor` is the library's until the
swap); measured against it by ``benchmarks/spike_core.py`` and ``benchmarks/bench_compile.py
--core``, checked by ``tests/shardtensor/test_aten_*.py``. See ``docs/design/core.md``.
"""

from meshshard.shardtensor._aten import (  # noqa: F401  (each registers its rules)
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
from meshshard.shardtensor._aten.tensor import AtenShardTensor, ShardTensor, from_local_aten

__all__ = ["AtenShardTensor", "ShardTensor", "from_local", "from_local_aten", "redistribute"]
