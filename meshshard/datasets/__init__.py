"""Datasets: schemas, the DrivaerML reader, synthetic runs, curator stores, shard loaders.

- :func:`read_run` reads a run directory (surface, volume, STL; non-dimensional fields)
  through :mod:`meshshard.io.vtkxml`: only the named arrays, decoded in parallel, volumes
  streamed;
- :class:`DatasetSchema` / :data:`DRIVAERML` name the files and fields of a dataset;
- :func:`make_synthetic_run` writes a DrivaerML-like run of any size;
- :func:`load_shard` / :class:`ShardedRunDataset` read one rank's rows of a store (no
  collective); :mod:`~meshshard.datasets.curator` does the same for physicsnemo-curator stores;
- :mod:`~meshshard.datasets.graphstore`: mesh graphs stored beside the rows.

Depends on :mod:`meshshard.io`, :mod:`meshshard.store`, :mod:`meshshard.partition` and
:mod:`meshshard.shardtensor`.
"""

from __future__ import annotations

from meshshard.datasets.drivaerml import RunData, read_run
from meshshard.datasets.loader import ShardedRunDataset, load_halo, load_shard
from meshshard.datasets.schema import DRIVAERML, DatasetSchema, FieldSpec
from meshshard.datasets.synthetic import make_synthetic_run

__all__ = [
    "DRIVAERML",
    "DatasetSchema",
    "FieldSpec",
    "RunData",
    "ShardedRunDataset",
    "load_halo",
    "load_shard",
    "make_synthetic_run",
    "read_run",
]
