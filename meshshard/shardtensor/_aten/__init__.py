"""Spike for issue 22: a ShardTensor with autograd on the wrapper, dispatched at aten level.

Not exported; measured against :mod:`meshshard.shardtensor` by ``benchmarks/spike_core.py`` and
checked by ``tests/shardtensor/test_aten_spike.py``. See ``docs/design/core.md``.
"""

from meshshard.shardtensor._aten import rules_attention as _rules_attention  # noqa: F401
from meshshard.shardtensor._aten import rules_fused as _rules_fused  # noqa: F401
from meshshard.shardtensor._aten import rules_graph as _rules_graph  # noqa: F401
from meshshard.shardtensor._aten.layout import from_local, redistribute
from meshshard.shardtensor._aten.tensor import AtenShardTensor, from_local_aten

__all__ = ["AtenShardTensor", "from_local", "from_local_aten", "redistribute"]
