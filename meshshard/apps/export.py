"""Export a trained surface model as a model checkpoint that ``predict``/``evaluate`` read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch import nn

from meshshard.apps.model_file import save_model
from meshshard.store.format import open_store

__all__ = ["export_surface_model"]


def export_surface_model(
    path: str | Path,
    model: nn.Module,
    *,
    model_config: dict,
    knn: int,
    store: str | Path,
    target_mean: Sequence[float],
    target_std: Sequence[float],
    extra: dict | None = None,
) -> Path:
    """Write ``model`` (trained on ``load_sample`` inputs of surface stores, targets scaled as
    ``(y - target_mean) / target_std``) with the field names, columns and non-dimensional
    scales of ``store`` (a meshshard store it was trained on). Collective when distributed."""
    _, attrs = open_store(store)
    sa = attrs["surface"]
    cols = sa["columns"]
    fields = sorted(([n, a, b] for n, (a, b) in cols.items()), key=lambda f: f[1])
    ds = attrs.get("dataset") or {}
    scales = {"dataset": sa.get("scales") or {}, "u_inf": ds.get("u_inf"), "rho": ds.get("rho"),
              "conventions": sa.get("conventions") or {},
              "field_sources": ds.get("field_sources") or {},
              "target_mean": [float(v) for v in target_mean],
              "target_std": [float(v) for v in target_std]}
    inputs = {"part": "surface", "knn": int(knn), "coords": "surface_mesh_centers (standardised)",
              "features": "surface_normals + 4 kNN geometric features (standardised)"}
    return save_model(path, model, config=model_config, fields=fields, scales=scales,
                      inputs=inputs, extra=extra)
