"""Checks on what a mesh reader returned (meshshard's or VTK's), before anything is computed.

Every failure is an :class:`~meshshard.io.errors.InputFileError` whose message starts with
the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshshard.io.errors import InputFileError
from meshshard.io.vtkxml import CellMesh

__all__ = ["check_points", "require_file", "validate_cells"]


def require_file(path: Path, what: str) -> None:
    if not path.is_file():
        msg = f"{path}: missing {what} file (a run directory holds its {what} as {path.name})"
        raise FileNotFoundError(msg)


def check_points(path: Path, points: np.ndarray) -> None:
    """An error unless ``points`` is (n, 3) with finite coordinates."""
    if points.ndim != 2 or points.shape[1] != 3:
        msg = f"{path}: points of shape {points.shape}, expected (n, 3)"
        raise InputFileError(msg, path)
    if points.size and not np.isfinite(points.sum(dtype=np.float64)):
        bad = ~np.isfinite(points).all(axis=1)
        if bad.any():
            msg = (
                f"{path}: {int(bad.sum())} of {points.shape[0]} points have non-finite (NaN/inf) "
                f"coordinates (first: point {int(np.flatnonzero(bad)[0])}); the mesh is damaged"
            )
            raise InputFileError(msg, path)


def validate_cells(path: str | Path, mesh: CellMesh) -> None:
    """Check what a reader returned (meshshard's or VTK's) before anything is computed from it.

    Checks: points (n, 3) and finite; offsets start at 0, never decrease and end at the
    connectivity's length; vertex ids in ``[0, n_points)``; every cell array has one row per
    cell. Field values are checked later (NaN policy).

    Raises
    ------
    InputFileError
        Naming ``path`` and what is wrong.
    """
    path = Path(path)
    points, off, conn = mesh.points, np.asarray(mesh.offsets), np.asarray(mesh.connectivity)
    check_points(path, points)
    problem = None
    if off.ndim != 1 or off.size < 1 or (off.size and int(off[0]) != 0):
        problem = f"cell offsets must start at 0 (found {off[:1].tolist()})"
    elif np.any(off[1:] < off[:-1]):
        i = int(np.flatnonzero(off[1:] < off[:-1])[0])
        problem = f"cell offsets decrease at cell {i} ({int(off[i])} -> {int(off[i + 1])})"
    elif int(off[-1]) != conn.size:
        problem = f"cell offsets end at {int(off[-1])}, but the connectivity has {conn.size} ids"
    elif conn.size and (int(conn.min()) < 0 or int(conn.max()) >= points.shape[0]):
        bad = int(conn.min()) if int(conn.min()) < 0 else int(conn.max())
        problem = f"a cell refers to point {bad}, but the mesh has {points.shape[0]} points"
    else:
        for name, arr in mesh.cell_data.items():
            if arr.shape[0] != mesh.n_cells:
                problem = f"cell array {name!r} has {arr.shape[0]} rows for {mesh.n_cells} cells"
                break
    if problem is not None:
        msg = f"{path}: {problem}; the mesh is damaged, re-export or re-download it"
        raise InputFileError(msg, path)
