"""meshshard: domain parallelism for irregular scientific data.

Cut unstructured meshes and point clouds into uneven shards (:mod:`meshshard.partition`), hold
them as uneven domain-parallel tensors (:mod:`meshshard.shardtensor`), run exact distributed
neighbour queries and halo exchanges (:mod:`meshshard.ops`), and stream DrivaerML-like data to
sharded zarr stores (:mod:`meshshard.pipelines`). Heavy modules load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = [
    "__version__",
    "models",
    "ops",
    "partition",
    "pipelines",
    "shardtensor",
]

_SUBMODULES = {"models", "ops", "partition", "pipelines", "shardtensor", "testing"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"meshshard.{name}")
    msg = f"module 'meshshard' has no attribute {name!r}"
    raise AttributeError(msg)
