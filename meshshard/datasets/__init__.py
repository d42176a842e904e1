"""Datasets: schemas, the DrivaerML reader, synthetic runs, curator stores, shard loaders.

- :func:`read_run` reads a run directory (surface, volume, STL; non-dimensional fields)
  through :mod:`meshshard.io.vtkxml`: only the named arrays, decoded in parallel, volumes
  streamed;
- :class:`DatasetSchema` / :data:`DRIVAERML` name the files and fields of a dataset;
- :func:`make_synthetic_run` writes a DrivaerML-like run of any size, :func:`generate_runs`
  many runs of different cars (a :class:`~meshshard.datasets.synthetic.Morph` per run);
- :func:`load_shard` / :class:`ShardedRunDataset` read one rank's rows of a store (no
  collective); :mod:`~meshshard.datasets.curator` does the same for physicsnemo-curator stores;
- :mod:`~meshshard.datasets.graphstore`: mesh graphs stored beside the rows.

Depends on :mod:`meshshard.io`, :mod:`meshshard.store`, :mod:`meshshard.partition` and
:mod:`meshshard.shardtensor`. The names below load on first use: a process that only reads
runs (a preprocessing worker) never imports torch through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshshard.datasets.drivaerml import RunData, read_run
    from meshshard.datasets.graphstore import surface_dual_adjacency, write_graph
    from meshshard.datasets.loader import ShardedRunDataset, load_halo, load_shard
    from meshshard.datasets.schema import DRIVAERML, DatasetSchema, FieldSpec
    from meshshard.datasets.synthetic import Morph, generate_runs, make_synthetic_run

#: public name -> the submodule that defines it
_EXPORTS = {
    "DRIVAERML": "schema",
    "DatasetSchema": "schema",
    "FieldSpec": "schema",
    "Morph": "synthetic",
    "RunData": "drivaerml",
    "ShardedRunDataset": "loader",
    "generate_runs": "synthetic",
    "load_halo": "loader",
    "load_shard": "loader",
    "make_synthetic_run": "synthetic",
    "read_run": "drivaerml",
    "surface_dual_adjacency": "graphstore",
    "write_graph": "graphstore",
}

__all__ = [
    "DRIVAERML",
    "DatasetSchema",
    "FieldSpec",
    "Morph",
    "RunData",
    "ShardedRunDataset",
    "generate_runs",
    "load_halo",
    "load_shard",
    "make_synthetic_run",
    "read_run",
    "surface_dual_adjacency",
    "write_graph",
]


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        msg = f"module 'meshshard.datasets' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(f"meshshard.datasets.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
