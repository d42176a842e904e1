"""What rank 0 writes after a prediction: the run's VTK file with ``<field>Pred`` arrays (or a
point cloud of the cell centres for a store) and ``prediction.json``; for
:mod:`~meshshard.apps.predict` (surface) and :mod:`~meshshard.apps.volume` alike.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.apps.inputs import SurfaceRows
from meshshard.apps.model_file import ModelFile

__all__ = ["fields_raw", "write_summary", "write_vtk"]


def fields_raw(mf: ModelFile, rows: SurfaceRows, pred: np.ndarray) -> dict[str, np.ndarray]:
    """The predicted fields in raw units (the run's scales, else the checkpoint's), one array
    per field ((n,) or (n, k))."""
    out = {}
    for name, a, b in mf.fields:
        scale = float(rows.scales.get(name, mf.scales.get("dataset", {}).get(name, 1.0)))
        v = pred[:, a:b] * scale
        out[name] = v[:, 0] if b - a == 1 else v
    return out


def write_vtk(mf: ModelFile, rows: Any, full: dict, out_dir: Path, truth: bool,
              cloud_name: str = "surface.vtp") -> Path:
    """A copy of the run's VTK file with ``<field>Pred`` cell arrays, or for a store a point
    cloud ``cloud_name`` (with the true fields when ``truth``). ``rows``: surface or volume
    rows (``vtk``, ``columns``, ``scales``)."""
    import pyvista as pv

    pred = fields_raw(mf, rows, full["pred"])
    perm = full["perm"]
    if rows.vtk is not None:
        mesh = pv.read(rows.vtk)
        dst = out_dir / rows.vtk.name
        for name, v in pred.items():
            arr = np.full((mesh.n_cells, *v.shape[1:]), np.nan, dtype=np.float32)
            arr[perm] = v
            mesh.cell_data[f"{name}Pred"] = arr
    else:
        order = np.argsort(perm, kind="stable")
        mesh = pv.PolyData(full["centers"][order])
        for name, v in pred.items():
            mesh.point_data[f"{name}Pred"] = v[order].astype(np.float32)
        if truth:
            for name, (a, b) in rows.columns.items():
                v = full["fields"][order, a:b] * float(rows.scales[name])
                mesh.point_data[name] = (v[:, 0] if b - a == 1 else v).astype(np.float32)
        dst = out_dir / cloud_name
    tmp = dst.with_name(f".{dst.stem}.tmp{dst.suffix}")
    mesh.save(tmp)
    tmp.replace(dst)
    return dst


def write_summary(summary: dict, files: dict, out_dir: Path, t0: float) -> None:
    """Rank 0's ``out_dir/prediction.json``: ``summary`` with its ``files`` and total seconds
    since ``t0`` (``files`` gains the JSON's own path)."""
    summary["files"] = files
    summary["seconds"]["total"] = time.perf_counter() - t0
    js = out_dir / "prediction.json"
    js.write_text(json.dumps(summary, indent=1))
    files["json"] = str(js)
