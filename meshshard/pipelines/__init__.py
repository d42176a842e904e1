"""Preprocessing orchestration: many runs -> partition-aware sharded stores.

- :func:`preprocess_runs` / :func:`process_run` write ``run_<i>.zarr`` stores (atomic,
  resumable, parallel over worker processes); ``meshshard preprocess`` is the command;
- :class:`RunOptions`: what is done with every run (parts, method, parts of the run, halo,
  graph, ...), one frozen value checked before any run starts;
- :mod:`~meshshard.pipelines.distributed`: ``preprocess --distributed``, one run read and
  partitioned by all ranks together.

The rooms below: :mod:`meshshard.io` (reading files), :mod:`meshshard.store` (the store
format), :mod:`meshshard.datasets` (schemas, the DrivaerML reader, synthetic runs, loaders).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from meshshard.pipelines.options import RunOptions
from meshshard.pipelines.preprocess import RunResult, preprocess_runs, process_run

if TYPE_CHECKING:
    from meshshard.pipelines.distributed import preprocess_distributed

__all__ = ["RunOptions", "RunResult", "preprocess_distributed", "preprocess_runs", "process_run"]


def __getattr__(name: str) -> Any:
    """``preprocess_distributed`` loads on first use: it imports torch, which a preprocessing
    worker never needs."""
    if name == "preprocess_distributed":
        value = importlib.import_module("meshshard.pipelines.distributed").preprocess_distributed
        globals()[name] = value
        return value
    msg = f"module 'meshshard.pipelines' has no attribute {name!r}"
    raise AttributeError(msg)
