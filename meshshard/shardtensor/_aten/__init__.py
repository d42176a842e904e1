"""Spike for issue 22: a ShardTensor with autograd on the wrapper, dispatched at aten level.

Not exported; measured against :mod:`meshshard.shardtensor` by ``benchmarks/spike_core.py`` and
checked by ``tests/shardtensor/test_aten_spike.py``. See ``docs/design/core-spike.md``.
"""

from meshshard.shardtensor._aten import (  # noqa: F401  (register the grid rules)
    rules_grid,
    rules_grid_circular,
    rules_grid_norm,
    rules_grid_resample,
    rules_grid_window,
)
from meshshard.shardtensor._aten.tensor import AtenShardTensor, from_local_aten

__all__ = ["AtenShardTensor", "from_local_aten"]
