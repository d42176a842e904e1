"""The ShardTensor engine: a wrapper subclass with autograd on the wrapper, dispatched at the
aten level (:mod:`.dispatch`), one registry of rules (:mod:`.registry`), layouts and their
conversions, and the custom ops of the compiled and bucketed paths. The rules themselves, one
module per op family, are in :mod:`meshshard.shardtensor.rules`; importing
:mod:`meshshard.shardtensor` registers them all. See ``docs/design/core.md``.
"""

from meshshard.shardtensor._aten import compiled_outputs, engine  # noqa: F401  (custom ops)
from meshshard.shardtensor._aten.layout import from_local, redistribute
from meshshard.shardtensor._aten.tensor import ShardTensor, wrap_local

__all__ = ["ShardTensor", "from_local", "redistribute", "wrap_local"]
