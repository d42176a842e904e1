"""Read an STL body (binary or ASCII, through VTK), triangulated and validated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshshard.io.errors import InputFileError
from meshshard.io.geometry import polygon_geometry, vtk_cells
from meshshard.io.validate import require_file, validate_cells
from meshshard.io.vtklog import capture_vtk_output
from meshshard.io.vtkxml import CellMesh

__all__ = ["StlData", "read_stl"]


@dataclass
class StlData:
    """The body: ``coordinates`` (V, 3), ``faces`` (T, 3) int64, ``centers`` (T, 3),
    ``areas`` (T,)."""

    coordinates: np.ndarray
    faces: np.ndarray
    centers: np.ndarray
    areas: np.ndarray

    @property
    def length(self) -> float:
        """Extent along x (the car's length)."""
        x = self.coordinates[:, 0]
        return float(x.max() - x.min())


def _binary_stl_problem(path: Path) -> str | None:
    """What is wrong with a binary STL whose triangles VTK did not return (None: not binary,
    or nothing found)."""
    size = path.stat().st_size
    if size < 84:
        return None
    with open(path, "rb") as fh:
        fh.seek(80)
        count = int(np.frombuffer(fh.read(4), "<u4")[0])
        if 84 + 50 * count != size:
            return None  # not a binary STL (or a damaged one VTK has spoken about)
        rec = np.dtype([("normal", "<f4", 3), ("v", "<f4", (3, 3)), ("attr", "<u2")])
        tri = np.fromfile(fh, rec, count)
    bad = ~np.isfinite(tri["v"]).all(axis=(1, 2))
    if bad.any():
        return (
            f"{int(bad.sum())} of {count} triangles have non-finite (NaN/inf) vertices "
            f"(first: triangle {int(np.flatnonzero(bad)[0])})"
        )
    return None


def read_stl(path: str | Path) -> StlData:
    """Read an STL body (triangulated if needed).

    Raises
    ------
    InputFileError
        Damaged or empty file, non-finite vertices, vertex ids out of range (named).
    """
    import pyvista as pv

    path = Path(path)
    require_file(path, "STL")
    try:
        with capture_vtk_output() as said, pv.VtkErrorCatcher(raise_errors=True):
            mesh = pv.read(str(path))
    except (RuntimeError, OSError) as exc:
        why = said.summary() or str(exc).strip()
        msg = f"{path}: truncated or corrupt STL file ({why[:300]})"
        raise InputFileError(msg, path) from exc
    if mesh.n_cells == 0:
        problem = _binary_stl_problem(path)
        if problem is not None:
            msg = f"{path}: {problem}; the STL is damaged, re-export it"
        else:
            msg = f"{path}: has 0 triangles; the file is empty or truncated"
        raise InputFileError(msg, path)
    if not mesh.is_all_triangles:
        mesh = mesh.triangulate()
    points = np.asarray(mesh.points, dtype=np.float32)
    offsets, conn = vtk_cells(mesh.GetPolys())
    if offsets.size - 1 != mesh.n_cells:
        msg = f"{path}: {mesh.n_cells - offsets.size + 1} cells are not triangles"
        raise InputFileError(msg, path)
    validate_cells(path, CellMesh(points, offsets, conn, {}, []))
    centers, _, areas = polygon_geometry(points, offsets, conn)
    return StlData(
        coordinates=points,
        faces=conn.reshape(-1, 3).astype(np.int64),
        centers=centers,
        areas=areas,
    )
