"""One rank's predicted rows, for any model part (surface, volume): the field checks, the
model forward (chunked or not), the truth laid out like the prediction, and the gathering of
every rank's rows on rank 0.

:mod:`~meshshard.apps.predict`, :mod:`~meshshard.apps.volume` and
:mod:`~meshshard.apps.evaluate` share these; predict hands volume checkpoints to volume, so
they live below both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshshard.apps.chunk_budgets import DEFAULT_BUDGET
from meshshard.apps.chunked import chunked_forward
from meshshard.apps.input_checks import check_predictions
from meshshard.apps.inputs import SurfaceRows
from meshshard.apps.model_file import ModelFile
from meshshard.comm.host import Comm
from meshshard.datasets.schema import DRIVAERML
from meshshard.shardtensor import Shard, from_local

__all__ = ["check_conventions_match", "check_fields", "gather_for_writing", "gather_rows",
           "run_model", "truth_columns"]


def _dist() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _optional() -> set[str]:
    return {f.name for f in DRIVAERML.surface_fields if not f.required}


def check_fields(mf: ModelFile, rows: SurfaceRows, source: Any, *, need_truth: bool
                 ) -> dict[str, tuple[int, int]]:
    """The model's output columns of the fields whose truth the run holds. A run with none of
    them is fine for predict (a new car); one that lacks a required field the model predicts
    while holding others is an error (another dataset or units), and so is any missing
    required field when ``need_truth``. Optional fields (``CpMeanTrim``) may be absent.

    Raises
    ------
    ValueError
        Naming the run, the missing field and the fields present.
    """
    cols = mf.field_columns()
    present = {n: c for n, c in cols.items() if n in rows.columns}
    missing = [n for n in cols if n not in rows.columns and n not in _optional()]
    if missing and (present or need_truth):
        msg = (f"{source}: has no field {missing[0]!r}, which {mf.path} predicts (fields "
               f"present: {sorted(rows.columns)})")
        raise ValueError(msg)
    return {} if missing else present


def check_conventions_match(mf: ModelFile, rows: SurfaceRows, source: Any) -> None:
    """The model was trained on normals pointing the way ``rows``' do (its features include
    them). A model file that recorded no conventions (written before they were recorded)
    passes.

    Raises
    ------
    ValueError
        The model's training data and ``source`` hold normals of opposite orientation.
    """
    want = (mf.scales.get("conventions") or {}).get("normals")
    have = rows.conventions.get("normals")
    if want and have and want != have:
        msg = (f"{source}: its normals are {have!r}, the data {mf.path} was trained on had "
               f"{want!r}; re-preprocess the training data with this meshshard, or retrain")
        raise ValueError(msg)


def run_model(mf: ModelFile, coords: torch.Tensor, feats: torch.Tensor, sizes: list[int], *,
              mesh: Any = None, max_points_per_chunk: int | None = DEFAULT_BUDGET
              ) -> np.ndarray:
    """The model on this rank's inputs (1, n, .), ``max_points_per_chunk`` points a chunk
    (:mod:`~meshshard.apps.chunk_budgets`; or not chunked, with ``max_points_per_chunk=None``:
    on ShardTensors of ``sizes`` when distributed), returned
    de-standardised (n, C), non-dimensional. Collective when distributed."""
    model = mf.model
    with torch.no_grad():
        if max_points_per_chunk is None:
            if mesh is not None and mesh.size() > 1:
                c = from_local(coords[0], mesh, [Shard(0)], sharding_shapes=sizes,
                               validate=False).unsqueeze(0)
                f = from_local(feats[0], mesh, [Shard(0)], sharding_shapes=sizes,
                               validate=False).unsqueeze(0)
                y = model(c, f).to_local()
            else:
                y = model(coords, feats)
        else:
            group = mesh.get_group() if mesh is not None else False
            y = chunked_forward(model, (coords, feats), max_points_per_chunk=max_points_per_chunk,
                                group=group, release=True)
    mean = torch.tensor(mf.scales["target_mean"], dtype=y.dtype)
    std = torch.tensor(mf.scales["target_std"], dtype=y.dtype)
    out = (y[0] * std + mean).numpy()
    check_predictions(out, mesh.get_group() if mesh is not None else None)  # every rank
    return out


def truth_columns(cols: dict, rows: SurfaceRows, pred: np.ndarray):
    """The true fields laid out like the model's output (absent columns: the prediction,
    so they add nothing to the sums), and the columns to compare."""
    true = pred.copy()
    for n, (a, b) in cols.items():
        true[:, a:b] = rows.fields[:, slice(*rows.columns[n])]
    return cols, true


def gather_rows(arrays: dict[str, np.ndarray], group: Any = None) -> dict[str, np.ndarray] | None:
    """Every rank's rows of ``arrays`` on rank 0 (rank order); None elsewhere. Collective when
    distributed."""
    rank, world = _dist()
    if world == 1:
        return arrays
    comm = Comm(group, what="gather_rows")
    out = {}
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        send = np.zeros(world, dtype=np.int64)
        send[0] = a.shape[0]
        got, _ = comm.alltoallv(a, send)
        out[k] = got
    return out if rank == 0 else None


def gather_for_writing(rows: Any, pred: np.ndarray, group: Any, out: str | Path
                       ) -> tuple[dict | None, Path | None]:
    """Every rank's predictions (with permutation, and centres and fields where there is no
    source VTK to copy) gathered to rank 0, and rank 0's output folder ``out/rows.name``
    (made). Other ranks get ``(None, None)``. Collective."""
    arrays = {"pred": pred.astype(np.float32), "perm": rows.perm}
    if rows.vtk is None:
        arrays.update(centers=rows.centers, fields=rows.fields)
    full = gather_rows(arrays, group)
    if full is None:
        return None, None
    out_dir = Path(out) / rows.name
    out_dir.mkdir(parents=True, exist_ok=True)
    return full, out_dir
