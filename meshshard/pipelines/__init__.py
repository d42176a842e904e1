"""Preprocessing orchestration: many runs -> partition-aware sharded stores.

- :func:`preprocess_runs` / :func:`process_run` write ``run_<i>.zarr`` stores (atomic,
  resumable, parallel over worker processes); ``meshshard preprocess`` is the command;
- :mod:`~meshshard.pipelines.distributed`: ``preprocess --distributed``, one run read and
  partitioned by all ranks together.

The rooms below: :mod:`meshshard.io` (reading files), :mod:`meshshard.store` (the store
format), :mod:`meshshard.datasets` (schemas, the DrivaerML reader, synthetic runs, loaders).
"""

from __future__ import annotations

from meshshard.pipelines.preprocess import RunResult, preprocess_runs, process_run

__all__ = ["RunResult", "preprocess_runs", "process_run"]
