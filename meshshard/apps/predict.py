"""``meshshard predict``: a model checkpoint on one run, domain-parallel, fields back in VTK.

Every rank reads its slice of the run (:mod:`~meshshard.apps.inputs`), the ranks partition it
together, build the model's inputs on the shards (exact kNN features over all ranks, global
standardisation; the kNN ``max_queries_per_chunk`` queries a round), and run the model chunk by
chunk (:func:`~meshshard.apps.chunked.chunked_forward`, ``max_points_per_chunk`` per chunk on
every rank; the budgets: :mod:`~meshshard.apps.chunk_budgets`). The predictions
(non-dimensional) are then gathered on rank 0, which writes

- ``OUT/<run>/boundary_<i>.vtp``: a copy of the input surface with ``<field>Pred`` cell arrays
  (raw units, as the true arrays beside them) for a run directory; for a store, a point cloud
  ``OUT/<run>/surface.vtp`` of the cell centres with predicted and true arrays;
- ``OUT/<run>/pressure.png``: predicted and true surface pressure and their difference;
- ``OUT/<run>/prediction.json``: counts, timings and, where the truth is present, relative L2
  errors and drag/lift (:mod:`~meshshard.apps.forces`).

Models: checkpoints of :class:`~meshshard.models.Transolver` trained on surface centres,
normals and kNN features (what ``examples/train_drivaerml.py`` and ``meshshard demo`` write),
or on volume cell centres (``inputs.part = "volume"``: :mod:`~meshshard.apps.volume`, which
writes a copy of the ``.vtu``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshshard.apps.chunk_budgets import DEFAULT_BUDGET, ChunkBudgets
from meshshard.apps.features import chunked_inputs
from meshshard.apps.figures import pressure_png
from meshshard.apps.forces import force_coefficients
from meshshard.apps.input_checks import (
    check_model_for_inference,
    check_predictions,
    check_reference_area,
    checked_errors,
    run_named,
    warn_rounds,
)
from meshshard.apps.inputs import SurfaceRows, read_surface_rows, reading_options
from meshshard.apps.model_file import ModelFile, ModelFileError, load_model
from meshshard.apps.reference import reference_area_for
from meshshard.apps.rows import (
    check_conventions_match,
    check_fields,
    gather_for_writing,
    gather_rows,
    run_model,
    truth_columns,
)
from meshshard.apps.train import build_inputs
from meshshard.apps.volume import predict_volume_run
from meshshard.apps.writer import fields_raw, write_summary, write_vtk
from meshshard.comm.process import init
from meshshard.shardtensor import Shard, from_local

__all__ = ["PREDICT_CLASSES", "check_fields", "gather_rows", "model_inputs", "predict_rows",
           "predict_run", "run_model"]

log = logging.getLogger(__name__)

#: model classes predict can run (their couplings are sums over points: chunked inference)
PREDICT_CLASSES = ("Transolver",)


def ensure_world() -> None:
    """The kNN features need a process group: make a world of one when there is none
    (:func:`meshshard.comm.process.init`; under torchrun, join it)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        init()


def model_inputs(rows: SurfaceRows, knn: int, mesh: Any,
                 max_queries_per_chunk: int | None = None, release: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's model inputs (1, n, 3) and (1, n, 7), built as in training (collective
    when ``mesh`` spans several ranks: exact kNN and global statistics); with
    ``max_queries_per_chunk``, the kNN is streamed that many queries a round and the neighbour
    rows gathered as it goes (:func:`~meshshard.apps.features.chunked_inputs`; ``release``:
    freed heap pages go back to the OS after every round)."""
    c = torch.from_numpy(rows.centers)
    n = torch.from_numpy(rows.normals)
    multi = mesh is not None and mesh.size() > 1
    if multi or max_queries_per_chunk is not None:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = mesh if mesh is not None else init_device_mesh("cpu", (1,))
        c = from_local(c, mesh, [Shard(0)], sharding_shapes=rows.sizes, validate=False)
        n = from_local(n, mesh, [Shard(0)], sharding_shapes=rows.sizes, validate=False)
        if max_queries_per_chunk is not None:
            return chunked_inputs(c, n, knn=knn, max_queries_per_chunk=max_queries_per_chunk,
                                  sizes=rows.sizes, release=release)
        coords, feats = build_inputs(c, n, knn=knn)
        return coords.to_local(), feats.to_local()
    return build_inputs(c, n, knn=knn)


def predict_rows(mf: ModelFile, rows: SurfaceRows, *, mesh: Any = None,
                 max_points_per_chunk: int | None = DEFAULT_BUDGET,
                 max_queries_per_chunk: int | None = None) -> np.ndarray:
    """Non-dimensional predictions (n, C) for this rank's rows. The budgets are
    :mod:`~meshshard.apps.chunk_budgets`': ``max_points_per_chunk=None`` runs the unchunked
    forward (on ShardTensors when distributed), ``max_queries_per_chunk=None`` follows
    ``max_points_per_chunk``. Collective when distributed."""
    b = ChunkBudgets.of(max_points_per_chunk, max_queries_per_chunk)
    coords, feats = model_inputs(rows, int(mf.inputs.get("knn", 8)), mesh,
                                 b.max_queries_per_chunk)
    return run_model(mf, coords, feats, rows.sizes, mesh=mesh,
                     max_points_per_chunk=b.max_points_per_chunk)


def predict_run(
    checkpoint: str | Path | ModelFile,
    source: str | Path,
    out: str | Path,
    *,
    mesh: Any = None,
    max_points_per_chunk: int | None = DEFAULT_BUDGET,
    max_queries_per_chunk: int | None = None,
    max_cells_per_round: int | None = None,
    png: bool = True,
    reference_area: float | None = None,
    u_inf: float | None = None,
    fields: Any = None,
    conventions: dict | None = None,
) -> dict[str, Any]:
    """Predict one run and write the outputs (see the module notes); returns the summary
    (rank 0 has the files, every rank the metrics). Collective when distributed: every rank
    of ``mesh`` (a 1-D DeviceMesh over the world) must call this.

    The three budgets are :mod:`~meshshard.apps.chunk_budgets`' (points per chunk of the
    model, kNN queries and volume cells per round; ``None`` for the last two: as
    ``max_points_per_chunk``, whose ``None`` runs the unchunked reference). On a run directory
    ``u_inf`` (m/s) scales the fields (default: the speed the model was trained with),
    ``fields`` maps the file's array names onto the model's and ``conventions`` (``normals``,
    ``shear``) states the file's (:func:`~meshshard.apps.inputs.reading_options`). Errors
    raised while the run is read or predicted name the run
    (:func:`~meshshard.apps.input_checks.run_named`); its geometry and truth are checked
    before the model runs (:func:`~meshshard.apps.input_checks.check_surface_rows`)."""
    check_reference_area(reference_area, "reference_area")
    b = ChunkBudgets.of(max_points_per_chunk, max_queries_per_chunk, max_cells_per_round)
    with run_named(source):
        t0 = time.perf_counter()
        ensure_world()
        mf = checkpoint if isinstance(checkpoint, ModelFile) else load_model(
            checkpoint, expect_class=PREDICT_CLASSES)
        if mf.class_name not in PREDICT_CLASSES:
            msg = f"{mf.path}: holds a {mf.class_name}; predict runs {list(PREDICT_CLASSES)}"
            raise ModelFileError(msg)
        check_model_for_inference(mf)
        if mf.inputs.get("part") == "volume":  # the volume cells (no PNG, no forces)
            return predict_volume_run(mf, source, out, mesh=mesh,
                                      max_points_per_chunk=b.max_points_per_chunk,
                                      max_cells_per_round=b.max_cells_per_round, u_inf=u_inf,
                                      fields=fields)
        return _predict_surface(mf, source, out, mesh, b, t0, png=png,
                                reference_area=reference_area,
                                reading=reading_options(source, mf, u_inf=u_inf, fields=fields,
                                                        **(conventions or {})))


def _predict_surface(mf: ModelFile, source: str | Path, out: str | Path, mesh: Any,
                     b: ChunkBudgets, t0: float, *, png: bool, reference_area: float | None,
                     reading: dict[str, Any]) -> dict[str, Any]:
    """:func:`predict_run` on the surface cells, ``reading`` the reader's options."""
    group = mesh.get_group() if mesh is not None else None
    rows = read_surface_rows(source, group, **reading)
    check_conventions_match(mf, rows, source)
    truth = check_fields(mf, rows, source, need_truth=False)
    warn_rounds(len(rows.centers), b.max_points_per_chunk, source)
    a_ref, a_from = reference_area_for(source, reference_area)  # a bad geo_ref fails here
    t_read = time.perf_counter() - t0
    t1 = time.perf_counter()
    pred = predict_rows(mf, rows, mesh=mesh, max_points_per_chunk=b.max_points_per_chunk,
                        max_queries_per_chunk=b.max_queries_per_chunk)
    # in the run's units (float64), within float32's range: the fields are written as float32
    raw = fields_raw(mf, rows, pred.astype(np.float64))
    check_predictions(np.concatenate([v.reshape(len(pred), -1) for v in raw.values()], axis=1)
                      if raw else pred, group, limit=float(np.finfo(np.float32).max))
    t_model = time.perf_counter() - t1
    summary: dict[str, Any] = {"run": rows.name, "source": str(source), "cells": rows.n_total,
                               "ranks": len(rows.sizes), "rows_per_rank": rows.sizes,
                               "max_points_per_chunk": b.max_points_per_chunk,
                               "max_queries_per_chunk": b.max_queries_per_chunk,
                               "u_inf": rows.u_inf, "u_inf_from": rows.u_inf_from,
                               "rho": rows.rho, "conventions": rows.conventions,
                               "seconds": {"read_partition": t_read, "inputs_model": t_model}}
    if truth:
        cols, true = truth_columns(truth, rows, pred)
        summary["rel_l2"] = checked_errors(pred, true, cols, group=group, source=source)
        summary["reference_area_from"] = a_from
        kw = {"reference_area": a_ref, "group": group}
        summary["forces_pred"] = force_coefficients(pred, cols, rows.normals, rows.areas, **kw)
        summary["forces_true"] = force_coefficients(true, cols, rows.normals, rows.areas, **kw)
    full, out_dir = gather_for_writing(rows, pred, group, out)
    if full is not None:  # rank 0 writes
        files = {"vtk": str(write_vtk(mf, rows, full, out_dir, truth))}
        if png:
            files["png"] = str(pressure_png(Path(files["vtk"]), out_dir / "pressure.png",
                                            truth=truth))
        write_summary(summary, files, out_dir, t0)
    return summary
