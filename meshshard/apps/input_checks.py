"""What ``predict`` and ``evaluate`` check in a run and their options before the model runs.

Every check names the run (its path) and the cause, and runs on every rank together: a rank
whose slice holds the bad row makes every rank raise (:func:`meshshard.comm.agree.raise_together`),
none is left waiting in a collective.

- options: ``--reference-area`` finite and > 0, ``--max-points-per-chunk`` not below
  :data:`~meshshard.apps.chunk_budgets.MIN_POINTS_PER_CHUNK` (each chunk runs the whole model
  once: 1 point per chunk took hours);
- a surface (:func:`check_surface_rows`): centres finite with squared distances inside
  float64, areas finite and > 0 (float32 areas of a mesh in the wrong units underflow to 0:
  said so), normals finite and of unit length, the truth finite, flow speed and density in
  :data:`~meshshard.store.curator_checks.FLOW_RANGE`;
- a volume (:func:`check_volume_rows`, :func:`check_volume_cells`): a ``.vtu`` of 3-D cells
  (a file of triangles is a surface, not a volume), centres and truth finite;
- the model (:func:`check_model_for_inference`): the target standardisation is there;
- :func:`run_named`: an error raised while a run is read or predicted names that run.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.apps.chunk_budgets import DEFAULT_BUDGET, MIN_POINTS_PER_CHUNK
from meshshard.apps.forces import field_errors
from meshshard.apps.model_checks import ModelFileError, check_for_inference
from meshshard.comm.agree import raise_together
from meshshard.errors import DistributedError, InputError
from meshshard.io.vtkxml import SeveralPieces, UnsupportedVtkXml, VtkXmlFile
from meshshard.partition._validation import check_distance_range
from meshshard.store.curator_checks import FLOW_RANGE

__all__ = ["check_inference_options", "check_model_for_inference", "check_points_per_chunk",
           "check_predictions", "check_reference_area", "check_surface_rows", "check_volume_cells",
           "check_volume_rows", "checked_errors", "run_named", "warn_rounds"]

log = logging.getLogger(__name__)

#: normals whose length differs from 1 by more than this are not unit normals
_UNIT_TOL = 1e-2
#: chunk rounds per rank above which predict warns with an estimate
_MANY_ROUNDS = 1000


def check_reference_area(value: float | None, what: str = "--reference-area") -> None:
    """``value`` (when given) is a finite area > 0 (``inf`` gave Cd = 0)."""
    if value is None:
        return
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        msg = f"{what} {value}: must be a finite area > 0 in m^2 (e.g. 2.17 for DrivaerML)"
        raise InputError(msg)


def check_points_per_chunk(value: int | None, what: str = "--max-points-per-chunk") -> None:
    """``value`` (when given) is at least
    :data:`~meshshard.apps.chunk_budgets.MIN_POINTS_PER_CHUNK`."""
    if value is not None and value < MIN_POINTS_PER_CHUNK:
        msg = (f"{what} {value} is below {MIN_POINTS_PER_CHUNK}: every chunk runs the whole "
               f"model once, so 1M points would take {1_000_000 // max(value, 1):,} forward "
               f"passes; use >= {MIN_POINTS_PER_CHUNK} (default {DEFAULT_BUDGET}; smaller uses "
               "less memory)")
        raise InputError(msg)


def check_inference_options(args: Any) -> None:
    """``--max-points-per-chunk`` (unless ``--unchunked``) and ``--reference-area`` of the
    predict and evaluate commands, before any rank reads a file."""
    if not getattr(args, "unchunked", False):
        check_points_per_chunk(args.max_points_per_chunk)  # 1 point per chunk ran for hours
    check_reference_area(getattr(args, "reference_area", None))


def warn_rounds(n_local: int, max_points_per_chunk: int | None, source: Any) -> None:
    """Log a warning with an estimate when ``max_points_per_chunk`` makes more than 1000
    chunks of the model on a rank."""
    if max_points_per_chunk is None or max_points_per_chunk < 1:
        return
    rounds = -(-n_local // max_points_per_chunk)
    if rounds > _MANY_ROUNDS:
        log.warning("%s: %d rows per rank in chunks of %d make %d model passes; raise "
                    "max_points_per_chunk to shorten the run", source, n_local,
                    max_points_per_chunk, rounds)


def check_model_for_inference(mf: Any) -> None:
    """The model file has what predict needs beyond :func:`load_model`'s checks."""
    check_for_inference(mf.path, mf.scales)


def _first(mask: np.ndarray, perm: np.ndarray | None = None) -> str:
    """``k row(s), first at row r``: ``r`` the source row (cell id in the VTK file, row of the
    store) through ``perm`` when given."""
    bad = np.flatnonzero(mask)
    at = int(bad[0]) if perm is None or perm.size != mask.size else int(perm[bad[0]])
    return f"{bad.size} row(s), first at row {at}"


def _extent(c: np.ndarray) -> float:
    if c.size == 0:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.max(c.max(axis=0).astype(np.float64) - c.min(axis=0)))


def _geometry_problem(source: Any, centers: np.ndarray, what: str, perm: np.ndarray) -> str:
    finite = np.isfinite(centers).all(axis=1)
    if not finite.all():
        return f"{source}: {what} centres are NaN or inf in {_first(~finite, perm)}"
    try:
        check_distance_range(centers, name=f"{source}: {what} centres")
    except ValueError as exc:
        return str(exc)
    return ""


def _flow_problem(source: Any, u_inf: float, rho: float) -> str:
    lo, hi = FLOW_RANGE
    if not (lo <= u_inf <= hi and lo <= rho <= hi):  # NaN fails too
        return (f"{source}: flow speed {u_inf:g} m/s and density {rho:g} kg/m^3 must lie in "
                f"[{lo:g}, {hi:g}] (the non-dimensional fields would over- or underflow)")
    return ""


def _truth_problem(source: Any, fields: np.ndarray, columns: dict, perm: np.ndarray) -> str:
    if fields.size == 0:
        return ""
    finite = np.isfinite(fields)
    if finite.all():
        return ""
    for name, (a, b) in columns.items():
        bad = ~finite[:, a:b].all(axis=1)
        if bad.any():
            return (f"{source}: true field {name} is NaN or inf in {_first(bad, perm)}; the truth "
                    "must be finite (repair or drop the run)")
    return f"{source}: the true fields are NaN or inf in {_first(~finite.all(axis=1), perm)}"


def _surface_problem(rows: Any, source: Any) -> str:
    p = _geometry_problem(source, rows.centers, "surface", rows.perm)
    if p:
        return p
    a = rows.areas
    bad = ~(np.isfinite(a) & (a > 0))
    if bad.any():
        kind = "NaN or inf" if not np.isfinite(a[bad]).all() else \
            "negative" if (a[bad] < 0).any() else "zero"
        msg = f"{source}: surface cell areas are {kind} in {_first(bad, rows.perm)}"
        ext = _extent(rows.centers)
        if kind == "zero" and 0 < ext < 1e-9:
            msg += (f"; the coordinates span only {ext:.3g}, so areas underflow to 0 in float32: "
                    "the mesh is in the wrong units, rescale it (metres)")
        else:
            msg += "; degenerate cells have no area or normal: drop them (e.g. pyvista clean)"
        return msg
    n = rows.normals
    length = np.sqrt(np.einsum("ij,ij->i", n.astype(np.float64), n.astype(np.float64)))
    bad = ~(np.abs(length - 1) <= _UNIT_TOL)  # NaN fails too
    if bad.any():
        return (f"{source}: surface normals are not unit vectors (NaN, zero or of another "
                f"length) in {_first(bad, rows.perm)}; the model reads unit normals")
    p = _truth_problem(source, rows.fields, rows.columns, rows.perm)
    return p or _flow_problem(source, rows.u_inf, rows.rho)


def check_surface_rows(rows: Any, source: Any, group: Any = None) -> None:
    """This rank's surface rows are fit for the model and the forces (see the module notes).

    Collective when distributed: every rank of ``group`` must call it.

    Raises
    ------
    InputError
        On every rank, naming the run, the array, the first bad row and the fix.
    """
    raise_together(_surface_problem(rows, source), group, InputError)


def check_volume_rows(rows: Any, source: Any, group: Any = None) -> None:
    """This rank's volume rows: finite centres (float64-safe extent) and finite truth.
    Collective when distributed."""
    p = _geometry_problem(source, rows.centers, "volume", rows.perm) or _truth_problem(
        source, rows.fields, rows.columns, rows.perm)
    raise_together(p, group, InputError)


def _dimension(code: int) -> int:
    try:
        from vtkmodules.vtkCommonDataModel import vtkCellTypes

        return int(vtkCellTypes.GetDimension(int(code)))
    except ImportError:  # pragma: no cover - vtk comes with pyvista
        return 3 if 10 <= code <= 16 or code in (24, 25, 26, 27, 29, 32, 33, 42) else 2


def _cell_types(path: Path) -> np.ndarray:
    """The VTK cell types of a ``.vtu`` (every piece), decoded alone."""
    out = []
    try:
        piece: int | None = None
        while True:
            try:
                with VtkXmlFile(path, piece=piece) as f:
                    arr = [a for a in f._arrays
                           if a.path[-1] == "Cells" and a.attrs.get("Name") == "types"]
                    if f.n_cells and len(arr) == 1:
                        t = f._dec.array(arr[0], f.n_cells, "<Cells> types")
                        f._dec.finish()
                        out.append(np.asarray(t).astype(np.int64))
                    n_pieces = f.n_pieces
            except SeveralPieces:
                piece = 0
                continue
            if piece is None or piece + 1 >= n_pieces:
                break
            piece += 1
    except UnsupportedVtkXml:
        import pyvista as pv

        return np.asarray(pv.read(path).celltypes, dtype=np.int64)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def check_volume_cells(path: str | Path) -> None:
    """``path`` (a ``.vtu``) holds 3-D cells only: a file of triangles or quads is a surface
    and must not be read as a volume (its cell centres are not volume points)."""
    path = Path(path)
    types = _cell_types(path)
    codes, counts = np.unique(types, return_counts=True)
    flat = {int(c): int(k) for c, k in zip(codes, counts) if _dimension(int(c)) < 3}
    if flat:
        try:
            import pyvista as pv

            names = {c: pv.CellType(c).name for c in flat}
        except Exception:
            names = {c: f"type {c}" for c in flat}
        shown = ", ".join(f"{k:,} {names[c]}" for c, k in flat.items())
        msg = (f"{path}: {sum(flat.values()):,} of {types.size:,} cells are not 3-D ({shown}); "
               "a volume model predicts on volume cells: give the volume mesh (e.g. "
               "foamToVTK's internal.vtu), not a surface")
        raise InputError(msg)


def _renamed(exc: Exception, text: str) -> Exception:
    try:
        new = type(exc)(text)
    except Exception:
        return InputError(text)
    return new if str(new) == text else InputError(text)


@contextlib.contextmanager
def run_named(source: Any) -> Iterator[None]:
    """Errors of the input kind (ValueError, meshshard's own but a DistributedError and a
    model file's) raised inside name ``source`` when their message does not already."""
    try:
        yield
    except (DistributedError, ModelFileError):
        raise
    except ValueError as exc:
        text = str(exc)
        if str(source) in text or Path(str(source)).name in text:
            raise
        raise _renamed(exc, f"{source}: {text}") from exc


def check_predictions(pred: np.ndarray, group: Any = None, limit: float = np.inf) -> None:
    """The model's (de-standardised) predictions on this rank are finite (and within
    ``limit``, e.g. float32's range for values about to be written as float32); else every
    rank raises (collective when distributed). Finite weights and inputs can still overflow."""
    ok = np.isfinite(pred) & (np.abs(pred) <= limit)
    bad = ~ok.all(axis=1) if pred.ndim == 2 else ~ok
    problem = ""
    if bad.any():
        problem = (f"the model's predictions are NaN or inf in {int(bad.sum())} row(s) (first "
                   f"at local row {int(np.flatnonzero(bad)[0])}): its inputs are outside what "
                   "it was trained on, or the model file is wrong")
    raise_together(problem, group, InputError)


def checked_errors(pred: np.ndarray, true: np.ndarray, columns: dict, *, group: Any = None,
                   source: Any = None) -> dict[str, float]:
    """:func:`~meshshard.apps.forces.field_errors`, refusing a field whose truth is zero on
    every row (a zero-filled store: its relative error would be NaN). Collective when
    distributed (the sums are global, so every rank raises alike)."""
    errs = field_errors(pred, true, columns, group=group)
    zero = [k for k, v in errs.items() if math.isnan(v)]
    if zero:
        msg = (f"{source}: true field {zero[0]} is zero on every row (a zero-filled or "
               "damaged store?); its relative error is undefined -- check the run's data")
        raise InputError(msg)
    return errs
