"""DrivaerML (and similar) CFD runs -> partition-aware sharded zarr stores -> ShardTensors.

- :func:`read_run` reads a run directory (surface, volume, STL; non-dimensional fields)
  through :mod:`meshshard.pipelines.vtkxml` (:func:`read_cells`, :class:`VtkXmlFile`): only
  the named arrays, decoded in parallel, volumes streamed.
- :func:`make_synthetic_run` writes a DrivaerML-like run of any size.
- :func:`preprocess_runs` / :func:`process_run` write ``run_<i>.zarr`` stores (atomic,
  resumable, parallel); ``meshshard preprocess`` is the command.
- :func:`load_shard` / :class:`ShardedRunDataset` read one rank's rows (no collective).
- :func:`inspect_store` summarises a store (used by ``meshshard inspect run_i.zarr``);
  :func:`verify_store` checks every chunk's crc32 (``meshshard inspect run_i.zarr --verify``).
"""

from __future__ import annotations

from meshshard.pipelines.drivaerml import RunData, read_run
from meshshard.pipelines.errors import InputFileError
from meshshard.pipelines.loader import ShardedRunDataset, load_halo, load_shard
from meshshard.pipelines.preprocess import RunResult, preprocess_runs, process_run
from meshshard.pipelines.schema import DRIVAERML, DatasetSchema, FieldSpec
from meshshard.pipelines.store import StoreError, inspect_store, open_store, verify_store
from meshshard.pipelines.synthetic import make_synthetic_run
from meshshard.pipelines.vtkxml import CorruptVtkXml, UnsupportedVtkXml, VtkXmlFile, read_cells

__all__ = [
    "DRIVAERML",
    "CorruptVtkXml",
    "DatasetSchema",
    "FieldSpec",
    "InputFileError",
    "RunData",
    "RunResult",
    "ShardedRunDataset",
    "StoreError",
    "UnsupportedVtkXml",
    "VtkXmlFile",
    "inspect_store",
    "load_halo",
    "load_shard",
    "make_synthetic_run",
    "open_store",
    "preprocess_runs",
    "process_run",
    "read_cells",
    "read_run",
    "verify_store",
]
