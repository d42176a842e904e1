"""Volume models: training samples, model checkpoints with ``inputs.part = "volume"``, and
``predict`` / ``evaluate`` on the volume cells of a run.

A volume model is a :class:`~meshshard.models.Transolver` on the volume cell centres with the
inputs of :func:`~meshshard.apps.volume_inputs.volume_inputs` (standardised coordinates; the
signed distance to the body and its log) and the volume fields (``UMeanTrim``, ``pMeanTrim``,
``nutMeanTrim``, non-dimensional) as targets, standardised per column. Predicting runs the same
chunked forward as the surface (:func:`~meshshard.apps.rows.run_model`); rank 0 writes

- ``OUT/<run>/volume_<i>.vtu``: a copy of the input ``.vtu`` with ``<field>Pred`` cell arrays in
  raw units beside the true arrays (run directories); for a store, a point cloud
  ``OUT/<run>/volume.vtp`` of the cell centres with predicted and true arrays;
- ``OUT/<run>/prediction.json``: counts, timings and, where the truth is present, the relative
  L2 error of every field over the volume cells (sums all-reduced over the ranks).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from meshshard.apps.chunk_budgets import ChunkBudgets
from meshshard.apps.input_checks import checked_errors
from meshshard.apps.inputs import reading_options, source_kind
from meshshard.apps.model_file import save_model
from meshshard.apps.rows import check_fields, gather_for_writing, run_model, truth_columns
from meshshard.apps.volume_inputs import (
    VOLUME_FEATURES,
    VolumeRows,
    read_volume_rows,
    volume_inputs,
)
from meshshard.apps.writer import write_summary, write_vtk
from meshshard.datasets.schema import DRIVAERML
from meshshard.shardtensor import Shard, from_local

__all__ = ["evaluate_volume", "export_volume_model", "is_volume_model", "load_volume_sample",
           "predict_volume_run", "predict_volume_rows"]


def is_volume_model(mf: Any) -> bool:
    """Whether a loaded model checkpoint predicts volume fields (``inputs.part``)."""
    return mf is not None and mf.inputs.get("part") == "volume"


def load_volume_sample(source: str | Path, mesh: Any = None, *,
                       max_cells_per_round: int | None = None) -> dict[str, Any]:
    """One run's volume inputs and targets on this rank (collective when distributed; the
    signed distances ``max_cells_per_round`` cells a round, :mod:`~meshshard.apps.chunk_budgets`).

    Returns ``{"coords": (1, m, 3), "features": (1, m, 2), "target": (1, m, F), "rows":
    VolumeRows}``; ShardTensors on ``mesh`` (sharded along the points) when ``mesh`` is given,
    local tensors otherwise. Targets are the non-dimensional fields, not standardised.
    """
    group = mesh.get_group() if mesh is not None else None
    rows = read_volume_rows(source, group)
    if not rows.columns:
        msg = f"{source}: has no volume fields to train on"
        raise ValueError(msg)
    coords, feats = volume_inputs(rows, group, max_cells_per_round)
    target = torch.from_numpy(rows.fields).unsqueeze(0)
    if mesh is not None:
        def st(x: torch.Tensor):
            return from_local(x[0], mesh, [Shard(0)], sharding_shapes=rows.sizes,
                              validate=False).unsqueeze(0)

        coords, feats, target = st(coords), st(feats), st(target)
    return {"coords": coords, "features": feats, "target": target, "rows": rows}


def export_volume_model(
    path: str | Path,
    model: nn.Module,
    *,
    model_config: dict,
    rows: VolumeRows,
    target_mean: list[float],
    target_std: list[float],
    extra: dict | None = None,
) -> Path:
    """Write a volume model (trained on :func:`load_volume_sample` inputs, targets scaled as
    ``(y - target_mean) / target_std``) with the field names, columns and non-dimensional
    scales of the run ``rows`` came from. Collective when distributed."""
    fields = sorted(([n, a, b] for n, (a, b) in rows.columns.items()), key=lambda f: f[1])
    scales = {"dataset": dict(rows.scales), "u_inf": DRIVAERML.u_inf, "rho": DRIVAERML.rho,
              "target_mean": [float(v) for v in target_mean],
              "target_std": [float(v) for v in target_std]}
    inputs = {"part": "volume", "coords": "volume_mesh_centers (standardised)",
              "features": VOLUME_FEATURES}
    return save_model(path, model, config=model_config, fields=fields, scales=scales,
                      inputs=inputs, extra=extra)


def predict_volume_rows(mf: Any, rows: VolumeRows, *, mesh: Any = None,
                        max_points_per_chunk: int | None = None,
                        max_cells_per_round: int | None = None) -> np.ndarray:
    """Non-dimensional predictions (m, C) for this rank's volume rows (collective when
    distributed). The budgets are :mod:`~meshshard.apps.chunk_budgets`'
    (``max_points_per_chunk=None``: the unchunked forward; ``max_cells_per_round=None``: as
    ``max_points_per_chunk``)."""
    b = ChunkBudgets.of(max_points_per_chunk, max_cells_per_round=max_cells_per_round)
    group = mesh.get_group() if mesh is not None else None
    coords, feats = volume_inputs(rows, group, b.max_cells_per_round)
    return run_model(mf, coords, feats, rows.sizes, mesh=mesh,
                     max_points_per_chunk=b.max_points_per_chunk)


def _write(mf: Any, rows: VolumeRows, full: dict, out_dir: Path, truth: bool) -> Path:
    return write_vtk(mf, rows, full, out_dir, truth, cloud_name="volume.vtp")


def _reading(source: str | Path, mf: Any, u_inf: float | None, fields: Any) -> dict[str, Any]:
    """``read_volume_rows``' keywords: a run directory's speed and field map, as for the
    surface (:func:`~meshshard.apps.inputs.reading_options`)."""
    opts = reading_options(source, mf, u_inf=u_inf, fields=fields)
    return {"fields": opts["fields"], "u_inf": opts["u_inf"] if Path(source).is_dir()
            and source_kind(source) == "run" else None}


def predict_volume_run(mf: Any, source: str | Path, out: str | Path, *, mesh: Any = None,
                       max_points_per_chunk: int | None = None,
                       max_cells_per_round: int | None = None, u_inf: float | None = None,
                       fields: Any = None) -> dict[str, Any]:
    """``meshshard predict`` with a volume model (module notes); returns the summary (rank 0
    has the files, every rank the metrics). Collective when distributed. The budgets are
    :func:`predict_volume_rows`'; ``u_inf`` and ``fields``: a run directory's flow speed and
    field map (default: the model's)."""
    b = ChunkBudgets.of(max_points_per_chunk, max_cells_per_round=max_cells_per_round)
    t0 = time.perf_counter()
    group = mesh.get_group() if mesh is not None else None
    rows = read_volume_rows(source, group, **_reading(source, mf, u_inf, fields))
    truth = check_fields(mf, rows, source, need_truth=False)
    t_read = time.perf_counter() - t0
    t1 = time.perf_counter()
    pred = predict_volume_rows(mf, rows, mesh=mesh, max_points_per_chunk=b.max_points_per_chunk,
                               max_cells_per_round=b.max_cells_per_round)
    summary: dict[str, Any] = {"run": rows.name, "source": str(source), "part": "volume",
                               "cells": rows.n_total, "ranks": len(rows.sizes),
                               "rows_per_rank": rows.sizes,
                               "max_points_per_chunk": b.max_points_per_chunk,
                               "max_cells_per_round": b.max_cells_per_round,
                               "seconds": {"read_partition": t_read,
                                           "inputs_model": time.perf_counter() - t1}}
    if truth:
        cols, true = truth_columns(truth, rows, pred)
        summary["rel_l2"] = checked_errors(pred, true, cols, group=group, source=source)
    full, out_dir = gather_for_writing(rows, pred, group, out)
    if full is not None:  # rank 0 writes
        files = {"vtk": str(_write(mf, rows, full, out_dir, bool(truth)))}
        write_summary(summary, files, out_dir, t0)
    return summary


def evaluate_volume(source: str | Path, mf: Any, *, mesh: Any = None,
                    max_points_per_chunk: int | None = None,
                    max_cells_per_round: int | None = None, u_inf: float | None = None,
                    fields: Any = None) -> dict[str, Any]:
    """Relative L2 error of every volume field ``mf`` predicts, over the run's volume cells
    (sums all-reduced; every rank gets the result). Collective when distributed. The budgets
    are :func:`predict_volume_rows`'.

    Raises
    ------
    ValueError
        The run lacks a field the model predicts (named).
    """
    group = mesh.get_group() if mesh is not None else None
    rows = read_volume_rows(source, group, **_reading(source, mf, u_inf, fields))
    cols = check_fields(mf, rows, source, need_truth=True)
    pred = predict_volume_rows(mf, rows, mesh=mesh, max_points_per_chunk=max_points_per_chunk,
                               max_cells_per_round=max_cells_per_round)
    cols, true = truth_columns(cols, rows, pred)
    return {"cells": rows.n_total, "rel_l2": checked_errors(pred, true, cols, group=group,
                                                                source=source)}
