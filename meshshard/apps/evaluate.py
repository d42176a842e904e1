"""``meshshard evaluate``: a model (or the truth itself) over a set of runs, as engineers read it.

Per run: relative L2 error of every predicted surface field, and drag and lift coefficients
integrated from the surface pressure and wall shear (:mod:`~meshshard.apps.forces`), predicted
against true. Over the runs: R^2 of predicted against true drag and lift. Rank 0 writes
``OUT/evaluation.txt`` (the table), ``OUT/evaluation.json`` and ``OUT/evaluation.png``
(:func:`~meshshard.apps.figures.evaluate_png`).

Without a checkpoint the prediction *is* the truth (errors 0, R^2 1 given two runs or more):
a check of the reading and the integration, whose coefficients the tests compare with an
independent pyvista computation.

Every run is read and predicted domain-parallel, as in :mod:`~meshshard.apps.predict`; the
metrics are sums all-reduced over the ranks, nothing is gathered.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.apps.chunk_budgets import DEFAULT_BUDGET, ChunkBudgets
from meshshard.apps.figures import evaluate_png, r2_caveat, r_squared
from meshshard.apps.forces import PRESSURE, WALL_SHEAR, force_coefficients
from meshshard.apps.input_checks import (
    check_model_for_inference,
    check_reference_area,
    checked_errors,
    run_named,
)
from meshshard.apps.inputs import read_surface_rows, reading_options
from meshshard.apps.model_file import ModelFileError, load_model
from meshshard.apps.predict import PREDICT_CLASSES, ensure_world, predict_rows
from meshshard.apps.reference import ESTIMATED, reference_area_for
from meshshard.apps.rows import check_conventions_match, check_fields, truth_columns
from meshshard.apps.volume import evaluate_volume, is_volume_model

__all__ = ["evaluate_runs", "format_table"]

log = logging.getLogger(__name__)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def evaluate_one(source: str | Path, mf: Any = None, *, mesh: Any = None,
                 max_points_per_chunk: int | None = DEFAULT_BUDGET,
                 max_queries_per_chunk: int | None = None,
                 max_cells_per_round: int | None = None,
                 reference_area: float | None = None, volume: Any = None,
                 u_inf: float | None = None, fields: Any = None,
                 conventions: dict | None = None) -> dict[str, Any]:
    """The metrics of one run (every rank gets them). Collective when distributed.

    ``mf`` is a surface model (or None: the truth against itself); ``volume`` a volume model,
    whose fields' errors over the volume cells are added as ``rel_l2["volume:<field>"]``.
    A volume model passed as ``mf`` evaluates the volume alone (no drag and lift: nan).
    The budgets are :mod:`~meshshard.apps.chunk_budgets`' (``None`` for the last two: as
    ``max_points_per_chunk``; evaluate always runs the model chunked, ``None`` there is
    :data:`~meshshard.apps.chunk_budgets.DEFAULT_BUDGET`). ``u_inf``, ``fields`` and
    ``conventions`` (``normals``, ``shear``) are a run directory's flow speed, field-name map
    and conventions (:func:`~meshshard.apps.inputs.reading_options`). Errors name the run
    (:func:`~meshshard.apps.input_checks.run_named`)."""
    check_reference_area(reference_area, "reference_area")
    b = ChunkBudgets.of(max_points_per_chunk or DEFAULT_BUDGET, max_queries_per_chunk,
                        max_cells_per_round)
    with run_named(source):
        surface = True
        if is_volume_model(mf):
            mf, volume, surface = None, mf, False
        t0 = time.perf_counter()
        if surface:
            out = _surface_metrics(source, mf, mesh=mesh, budgets=b,
                                   reference_area=reference_area, u_inf=u_inf, fields=fields,
                                   conventions=conventions)
        else:
            nan = float("nan")
            out = {"run": Path(source).name.removesuffix(".zarr"), "source": str(source),
                   "cells": 0, "rel_l2": {}, "cd_true": nan, "cd_pred": nan, "cl_true": nan,
                   "cl_pred": nan, "reference_area": nan, "reference_area_from": None}
        if volume is not None:
            v = evaluate_volume(source, volume, mesh=mesh,
                                max_points_per_chunk=b.max_points_per_chunk,
                                max_cells_per_round=b.max_cells_per_round, u_inf=u_inf,
                                fields=fields)
            out["volume_cells"] = v["cells"]
            out["rel_l2"].update({f"volume:{k}": e for k, e in v["rel_l2"].items()})
        out["seconds"] = time.perf_counter() - t0
        return out


def _surface_metrics(source: str | Path, mf: Any = None, *, mesh: Any = None,
                     budgets: ChunkBudgets, reference_area: float | None = None,
                     u_inf: float | None = None, fields: Any = None,
                     conventions: dict | None = None) -> dict[str, Any]:
    group = mesh.get_group() if mesh is not None else None
    rows = read_surface_rows(source, group, **reading_options(source, mf, u_inf=u_inf,
                                                              fields=fields, **(conventions or {})))
    if mf is not None:
        check_conventions_match(mf, rows, source)
        cols = check_fields(mf, rows, source, need_truth=True)
        pred = predict_rows(mf, rows, mesh=mesh,
                            max_points_per_chunk=budgets.max_points_per_chunk,
                            max_queries_per_chunk=budgets.max_queries_per_chunk)
        cols, true = truth_columns(cols, rows, pred)
    else:
        names = [n for n in (PRESSURE, WALL_SHEAR) if n in rows.columns]
        if len(names) < 2:
            missing = [n for n in (PRESSURE, WALL_SHEAR) if n not in rows.columns][0]
            msg = (f"{source}: has no field {missing!r} (fields present: "
                   f"{sorted(rows.columns)}); map the file's names with --fields FILE=SCHEMA "
                   "(--fields openfoam for p, wallShearStress, U, nut)")
            raise ValueError(msg)
        cols, c = {}, 0
        for n in names:
            a, b = rows.columns[n]
            cols[n] = (c, c + b - a)
            c += b - a
        true = np.concatenate([rows.fields[:, slice(*rows.columns[n])] for n in names], axis=1)
        pred = true
    a_ref, a_from = reference_area_for(source, reference_area)
    kw = {"reference_area": a_ref, "group": group}
    fp = force_coefficients(pred, cols, rows.normals, rows.areas, **kw)
    ft = force_coefficients(true, cols, rows.normals, rows.areas, **kw)
    return {"run": rows.name, "source": str(source), "cells": rows.n_total,
            "rel_l2": checked_errors(pred, true, cols, group=group, source=source),
            "cd_true": ft["cd"], "cd_pred": fp["cd"], "cl_true": ft["cl"], "cl_pred": fp["cl"],
            "reference_area": ft["reference_area"], "reference_area_from": a_from,
            "u_inf": rows.u_inf, "u_inf_from": rows.u_inf_from, "rho": rows.rho,
            "conventions": rows.conventions, "forces_true": ft, "forces_pred": fp}


def _clean(v: Any) -> Any:
    """JSON without NaN: nan -> null."""
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) else float(v)
    return v


def _fmt(v: float, spec: str = ".4f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


#: short names of the usual fields in the table's header (the legend under it spells them out)
_SHORT = {"pMeanTrim": "p", "wallShearStressMeanTrim": "wss", "UMeanTrim": "U",
          "nutMeanTrim": "nut", "CpMeanTrim": "Cp"}


def _short(field: str) -> str:
    """``pMeanTrim`` -> ``p``, ``volume:UMeanTrim`` -> ``vol U``; other names unchanged."""
    part, _, name = field.rpartition(":")
    short = _SHORT.get(name, name)
    return f"vol {short}" if part == "volume" else (f"{part}:{short}" if part else short)


def _count(n: int) -> str:
    """``49,952``; ``8.81M`` from a million up (the table stays narrow)."""
    return f"{n:,}" if n < 1_000_000 else f"{n / 1e6:.3g}M"


def format_table(result: dict[str, Any]) -> str:
    """The text table of :func:`evaluate_runs`' result, at most about 100 columns wide: each
    field's relative L2 error under a short name, drag and lift true / predicted / their
    difference, a legend, the summary over the runs and, where R^2 cannot say much, one line
    saying why."""
    rows = result["runs"]
    fields = sorted({k for r in rows for k in r["rel_l2"]})
    vol = any("volume_cells" in r for r in rows)
    head = ["run", "cells"] + (["vol cells"] if vol else []) + [_short(f) for f in fields] + [
        "Cd", "pred", "dCd", "Cl", "pred", "dCl"]
    body = []
    for r in rows:
        cells = [_count(r["cells"]) if r["cells"] else "-"]
        if vol:
            cells.append(_count(r["volume_cells"]) if "volume_cells" in r else "-")
        body.append([r["run"], *cells] + [_fmt(r["rel_l2"].get(f), ".3f") for f in fields] + [
            _fmt(r["cd_true"], ".3f"), _fmt(r["cd_pred"], ".3f"),
            _fmt(r["cd_pred"] - r["cd_true"], "+.3f"), _fmt(r["cl_true"], ".3f"),
            _fmt(r["cl_pred"], ".3f"), _fmt(r["cl_pred"] - r["cl_true"], "+.3f")])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = " ".join(h.rjust(w) for h, w in zip(head, widths))
    out = [f"model: {result['model'] or 'none (truth against truth)'}"]
    est = [r["run"] for r in rows if r.get("reference_area_from") == ESTIMATED]
    if est:
        out += _wrap(f"WARNING: no reference area for {', '.join(est)}: Cd and Cl use an "
                     "estimated frontal area", ["(give --reference-area, a geo_ref_<i>.csv, "
                                               "or preprocess with one)"])
    out += [line, "-" * len(line)]
    out += [" ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    s = result["summary"]
    out.append("-" * len(line))
    out.append(f"R^2 drag {_fmt(s['r2_cd'])}   R^2 lift {_fmt(s['r2_cl'])}   mean |dCd| "
               f"{_fmt(s['mean_abs_dcd'])}")
    out += _wrap("mean L2:", [f"{_short(f)} {_fmt(v)}" for f, v in s["mean_rel_l2"].items()])
    legend = [f"{_short(f)} = {f}" for f in fields if _short(f) != f]
    out += _wrap("relative L2 errors of", legend)
    out.append("Cd, Cl: true drag and lift coefficients; pred: predicted; dCd, dCl: pred - true")
    caveat = r2_caveat([r["cd_pred"] for r in rows], [r["cd_true"] for r in rows])
    if caveat:
        out.append(f"({caveat})")
    return "\n".join(out)


def _wrap(first: str, items: list[str], width: int = 100) -> list[str]:
    """``first`` then ``items`` joined by two spaces, in lines of at most ``width``."""
    lines, cur = [], first
    for item in items:
        if len(cur) + 2 + len(item) > width:
            lines.append(cur)
            cur = "  " + item
        else:
            cur += "  " + item
    return [*lines, cur]


def _checkpoints(checkpoint: Any) -> list:
    if checkpoint is None:
        return []
    if isinstance(checkpoint, (str, Path)):
        return [checkpoint]
    return list(checkpoint)


def _models(checkpoint: Any) -> tuple[Any, Any]:
    """The surface and the volume model of ``checkpoint`` (a path, or a list of at most one
    of each part; None where absent).

    Raises
    ------
    ModelFileError
        Two checkpoints for the same part, or unusable checkpoints (named).
    """
    got: dict[str, Any] = {}
    for c in _checkpoints(checkpoint):
        m = load_model(c, expect_class=PREDICT_CLASSES)
        check_model_for_inference(m)
        part = "volume" if is_volume_model(m) else "surface"
        if part in got:
            msg = (f"{c}: a second {part} model (after {got[part].path}); give at most one "
                   "surface and one volume checkpoint")
            raise ModelFileError(msg)
        got[part] = m
    return got.get("surface"), got.get("volume")


def evaluate_runs(
    sources: Sequence[str | Path],
    out: str | Path,
    *,
    checkpoint: str | Path | Sequence[str | Path] | None = None,
    mesh: Any = None,
    max_points_per_chunk: int | None = DEFAULT_BUDGET,
    max_queries_per_chunk: int | None = None,
    max_cells_per_round: int | None = None,
    reference_area: float | None = None,
    png: bool = True,
    u_inf: float | None = None,
    fields: Any = None,
    conventions: dict | None = None,
) -> dict[str, Any]:
    """Evaluate ``checkpoint`` (or the truth, without one) on every run of ``sources``; rank 0
    writes the table, JSON and PNG to ``out``. Collective when distributed.

    ``checkpoint`` may be a list of a surface and a volume model: the surface's errors, drag
    and lift, and the volume fields' errors (``volume:<field>``) over the volume cells. A
    volume model alone evaluates the volume alone (drag and lift are then n/a). The budgets are
    :func:`evaluate_one`'s."""
    check_reference_area(reference_area, "reference_area")
    ensure_world()
    mf, vmf = _models(checkpoint)
    if not sources:
        msg = "no runs to evaluate"
        raise ValueError(msg)
    if mf is None and vmf is not None:  # a volume model alone: the volume alone
        mf, vmf = vmf, None
    runs = [evaluate_one(s, mf, mesh=mesh, max_points_per_chunk=max_points_per_chunk,
                         max_queries_per_chunk=max_queries_per_chunk,
                         max_cells_per_round=max_cells_per_round,
                         reference_area=reference_area, volume=vmf, u_inf=u_inf, fields=fields,
                         conventions=conventions) for s in sources]
    fields = sorted({k for r in runs for k in r["rel_l2"]})
    summary = {
        "r2_cd": r_squared([r["cd_pred"] for r in runs], [r["cd_true"] for r in runs]),
        "r2_cl": r_squared([r["cl_pred"] for r in runs], [r["cl_true"] for r in runs]),
        "mean_abs_dcd": float(np.mean([abs(r["cd_pred"] - r["cd_true"]) for r in runs])),
        "mean_rel_l2": {f: float(np.mean([r["rel_l2"][f] for r in runs if f in r["rel_l2"]]))
                        for f in fields},
    }
    names = [str(c) for c in _checkpoints(checkpoint)]
    result = {"model": ", ".join(names) if names else None, "runs": runs,
              "summary": summary, "files": {}}
    if _rank() == 0:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        text = format_table(result)
        (out / "evaluation.txt").write_text(text + "\n")
        result["files"]["table"] = str(out / "evaluation.txt")
        if png:
            result["files"]["png"] = str(evaluate_png(runs, out / "evaluation.png"))
        result["files"]["json"] = str(out / "evaluation.json")
        (out / "evaluation.json").write_text(json.dumps(_clean(result), indent=1))
    return result
