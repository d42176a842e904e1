"""Reading meshes and point clouds for the CLI: ``.vtp .vtu .vtk .ply .stl`` (pyvista) and
``.npy`` (points). Errors name the file and say what was wrong with it."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.io.vtklog import capture_vtk_output
from meshshard.io.vtkxml import CorruptVtkXml, UnsupportedVtkXml, VtkXmlFile
from meshshard.partition.graph import dual_graph, knn_graph, mesh_connectivity, mesh_polyhedra
from meshshard.partition.weld import DEFAULT_WELD, Weld, weld_points

__all__ = [
    "MESH_SUFFIXES",
    "Geometry",
    "cell_centers",
    "dual_graph_supported",
    "load_geometry",
    "read_mesh",
    "read_points",
]

log = logging.getLogger(__name__)

MESH_SUFFIXES = (".vtp", ".vtu", ".vtk", ".ply", ".stl")


def _check_file(path: str | Path, suffixes: tuple[str, ...]) -> Path:
    p = Path(path)
    if p.is_dir():
        what = "an empty directory" if not any(p.iterdir()) else "a directory"
        msg = (
            f"{p}: is {what}, not a mesh or points file; give a file "
            f"({' '.join(suffixes)})"
        )
        raise ValueError(msg)
    if not p.is_file():
        msg = f"{p}: no such file"
        raise FileNotFoundError(msg)
    if p.suffix.lower() not in suffixes:
        msg = f"{p}: unsupported file type {p.suffix!r}; use one of {', '.join(suffixes)}"
        raise ValueError(msg)
    return p


def read_mesh(path: str | Path) -> Any:
    """Read a mesh with pyvista; VTK reader errors and warnings become a ValueError.

    Parameters
    ----------
    path : str or Path
        ``.vtp``, ``.vtu``, ``.vtk``, ``.ply`` or ``.stl``.

    Returns
    -------
    pyvista.DataSet

    Raises
    ------
    FileNotFoundError
        The file does not exist.
    ValueError
        Unsupported suffix, unreadable/truncated file, or a mesh without points.
    """
    import pyvista as pv
    from pyvista.core.utilities.observers import VtkErrorCatcher

    p = _check_file(path, MESH_SUFFIXES)
    if p.suffix.lower() == ".ply":
        _check_ply(p)  # VTK's PLY reader crashes the process on truncated binary files
    if p.suffix.lower() == ".vtu":
        _check_polyhedra(p)  # VTK trusts a polyhedron's face counts (SIGSEGV on a huge one)
    # VTK's own messages go to a buffer (not 20-odd lines on stderr) and into the error below
    with capture_vtk_output() as vtk_log, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with VtkErrorCatcher() as vtk_errors:
            try:
                mesh = pv.read(p)
            except Exception as exc:
                said = vtk_log.summary() or f"{type(exc).__name__}: {exc}"
                msg = f"{p}: unreadable mesh file (VTK: {said})"
                raise ValueError(msg) from exc
    problems = [str(e.alert).strip() for e in vtk_errors.events]
    problems += [str(w.message).strip() for w in caught if "error" in str(w.message).lower()]
    if problems:
        said = vtk_log.summary() or problems[0].splitlines()[0][:200]
        msg = f"{p}: unreadable or truncated mesh file (VTK: {said}); re-export or re-download it"
        raise ValueError(msg)
    if isinstance(mesh, pv.MultiBlock):
        msg = f"{p}: holds a multi-block dataset; save one block (e.g. mesh[0]) and retry"
        raise ValueError(msg)
    if mesh.n_points == 0:
        msg = f"{p}: the mesh has no points (empty or truncated file)"
        raise ValueError(msg)
    try:
        mesh_polyhedra(mesh)  # polyhedra (VTK type 42) need consistent faces
    except ValueError as exc:
        msg = f"{p}: {exc}; re-export the mesh (e.g. foamToVTK, or pyvista's save)"
        raise ValueError(msg) from None
    return mesh


def _check_polyhedra(p: Path) -> None:
    """Validate the polyhedron faces of a ``.vtu`` with meshshard's reader before VTK reads
    them; damage elsewhere in the file, and layouts that reader does not decode, are left to
    VTK (whose errors :func:`read_mesh` reports)."""
    try:
        with VtkXmlFile(p, threads=1, piece=0) as f:
            pieces = f.n_pieces
    except (UnsupportedVtkXml, CorruptVtkXml):
        return
    for i in range(pieces):
        try:
            with VtkXmlFile(p, threads=1, piece=i) as f:
                f.polyhedra()  # CorruptVtkXml (a ValueError naming the file)
        except UnsupportedVtkXml:
            return


_PLY_SIZES = {
    "char": 1, "int8": 1, "uchar": 1, "uint8": 1, "short": 2, "int16": 2, "ushort": 2,
    "uint16": 2, "int": 4, "int32": 4, "uint": 4, "uint32": 4, "float": 4, "float32": 4,
    "double": 8, "float64": 8,
}  # fmt: skip


def _check_ply(p: Path) -> None:
    """Refuse a PLY file shorter than its header promises (lower bound on the body size)."""
    size = p.stat().st_size
    with open(p, "rb") as fh:
        head = fh.read(min(size, 65536))
    end = head.find(b"end_header")
    if not head.startswith(b"ply") or end < 0:
        msg = f"{p}: not a PLY file or the header is truncated (no 'end_header')"
        raise ValueError(msg)
    body_start = head.index(b"\n", end) + 1 if b"\n" in head[end:] else len(head)
    lines = head[:end].decode("ascii", "replace").splitlines()
    fmt = next((ln.split()[1] for ln in lines if ln.startswith("format")), "ascii")
    need = 0
    rows = 0
    count = 0
    for ln in lines:
        parts = ln.split()
        if not parts:
            continue
        if parts[0] == "element":
            count = int(parts[2])
            rows += count
        elif parts[0] == "property" and parts[1] == "list":
            # at least the count and three indices per face
            need += count * (_PLY_SIZES.get(parts[2], 1) + 3 * _PLY_SIZES.get(parts[3], 4))
        elif parts[0] == "property":
            need += count * _PLY_SIZES.get(parts[1], 4)
    if fmt == "ascii":
        with open(p, "rb") as fh:
            fh.seek(body_start)
            have = sum(1 for line in fh if line.strip())
        if have < rows:
            msg = f"{p}: truncated PLY file ({have} data lines, the header promises {rows})"
            raise ValueError(msg)
    elif size - body_start < need:
        msg = (
            f"{p}: truncated PLY file ({size - body_start} body bytes, the header promises "
            f"at least {need})"
        )
        raise ValueError(msg)


def read_points(path: str | Path) -> np.ndarray:
    """Point coordinates of a ``.npy`` array of shape (N, 2|3) or of a mesh file's vertices.

    Returns
    -------
    ndarray of shape (N, 3) or (N, 2), float64
    """
    p = _check_file(path, (*MESH_SUFFIXES, ".npy"))
    if p.suffix.lower() != ".npy":
        return np.asarray(read_mesh(p).points, dtype=np.float64)
    with open(p, "rb") as fh:
        if fh.read(6) != b"\x93NUMPY":
            msg = f"{p}: not a .npy file (no NumPy header); write points with np.save(path, xyz)"
            raise ValueError(msg)
    try:
        arr = np.load(p, allow_pickle=False)
    except ValueError as exc:  # pickled object arrays are refused, never unpickled
        if "pickle" not in str(exc).lower():
            msg = f"{p}: unreadable or truncated .npy file ({exc})"
            raise ValueError(msg) from exc
        msg = (
            f"{p}: holds Python objects, not numbers; save the coordinates as a float array, "
            "e.g. np.save(path, np.asarray(xyz, dtype=float))"
        )
        raise ValueError(msg) from exc
    except Exception as exc:  # EOFError/OSError on truncated files
        msg = f"{p}: unreadable or truncated .npy file ({exc})"
        raise ValueError(msg) from exc
    if arr.ndim != 2 or arr.shape[1] not in (2, 3):
        msg = f"{p}: expected points of shape (N, 3) or (N, 2), found {arr.shape}"
        raise ValueError(msg)
    return np.asarray(arr, dtype=np.float64)


def cell_centers(mesh: Any) -> np.ndarray:
    """Vertex average of every cell (vectorised over the connectivity), shape (ncells, 3).

    Equals VTK's cell centre for simplices, parallelograms and parallelepipeds; for other
    cells it is the vertex centroid (for a polyhedron, of its distinct points; the centroid of
    its volume is :func:`meshshard.io.cellsizes.cell_volumes`). Any cell kind counts (lines
    and vertices too).
    """
    import pyvista as pv

    if isinstance(mesh, pv.PolyData) and mesh.n_cells != mesh.GetNumberOfPolys():
        # lines, vertices or strips: the dual graph refuses them, but they have centres
        ug = mesh.cast_to_unstructured_grid()
        conn = np.asarray(ug.cell_connectivity, dtype=np.int64)
        off = np.asarray(pv.convert_array(ug.GetCells().GetOffsetsArray()), dtype=np.int64)
    else:
        conn, off, _ = mesh_connectivity(mesh)
    pts = np.asarray(mesh.points, dtype=np.float64)
    counts = np.diff(off)
    if (counts == 0).any():
        msg = "the mesh has cells without vertices; clean it (e.g. mesh.clean()) first"
        raise ValueError(msg)
    sums = np.add.reduceat(pts[conn], off[:-1], axis=0) if counts.size else np.zeros((0, 3))
    return sums / counts[:, None]


def dual_graph_supported(mesh: Any) -> bool:
    """Whether :func:`~meshshard.partition.dual_graph` takes ``mesh``'s cells (PolyData with
    lines, vertices or strips is refused; polygons and linear volume cells are fine)."""
    import pyvista as pv

    if isinstance(mesh, pv.PolyData):
        return mesh.n_cells > 0 and mesh.n_cells == mesh.GetNumberOfPolys()
    return True


def _check_finite_points(pts: np.ndarray, source: str, on: str) -> None:
    """Name the mesh points (vertex ids) with NaN/inf coordinates, not the rows derived
    from them."""
    if pts.size and np.isfinite(pts.min()) and np.isfinite(pts.max()):
        return
    bad = np.flatnonzero(~np.isfinite(pts).all(axis=1))
    ids = ", ".join(str(i) for i in bad[:5].tolist()) + (", ..." if bad.size > 5 else "")
    if bad.size == 1:
        msg = f"{source}: point {ids} has NaN or inf coordinates"
    else:
        msg = f"{source}: points {ids} ({bad.size} in all) have NaN or inf coordinates"
    if on == "cells":
        msg += ", so the centres of the cells using them are undefined"
    msg += "; repair or remove those points (e.g. fix the export, or mesh.extract_points)"
    raise ValueError(msg)


@dataclass
class Geometry:
    """What a partition is computed on: the points (cell centres or vertices) and the mesh.

    Attributes
    ----------
    points : ndarray of shape (N, D)
        Cell centres when ``on == "cells"``, otherwise vertex coordinates.
    on : {"cells", "points"}
    mesh : pyvista.DataSet or None
        None for ``.npy`` point clouds.
    source : str
        The file path.
    """

    points: np.ndarray
    on: str
    mesh: Any = None
    source: str = ""
    #: the coincident points merged for the dual graph (:meth:`merge_points`)
    weld: Weld | None = None
    #: points that are copies of others but were kept apart (``merge_points(None)``)
    copies_kept: int = 0

    def merge_points(self, relative: float | None = DEFAULT_WELD) -> Weld | None:
        """Merge the mesh's coincident points for the dual graph (cells that share a face by
        coordinates, not by point ids, become neighbours): points closer than ``relative`` x
        the shortest edge. ``None`` or 0 merges nothing and counts the exact copies
        (:attr:`copies_kept`). Returns the :class:`~meshshard.partition.weld.Weld`."""
        if self.mesh is None or self.on != "cells" or not dual_graph_supported(self.mesh):
            return None
        conn, off, _ = mesh_connectivity(self.mesh)
        pts = np.asarray(self.mesh.points)
        if not relative:
            self.weld = None
            self.copies_kept = weld_points(pts, conn, off, tolerance=0.0).merged
            if self.copies_kept:
                log.info("%s: %d points are exact copies of others, not merged",
                            self.source, self.copies_kept)  # fmt: skip
            return None
        self.weld = weld_points(pts, conn, off, relative=relative)
        self.copies_kept = 0
        if self.weld.merged:
            log.info("%s: %s", self.source, self.weld.describe())
        return self.weld

    def merge_report(self) -> dict[str, Any]:
        """The report entries of :meth:`merge_points` (empty when it was not called)."""
        if self.weld is not None:
            return {"merged_points": self.weld.as_dict()}
        if self.copies_kept:
            return {"coincident_points_not_merged": self.copies_kept}
        return {}

    def field(self, name: str) -> np.ndarray:
        """Cell (``on="cells"``) or point array ``name``, shape (N,); errors list the fields."""
        if self.mesh is None:
            msg = f"{self.source}: a .npy point cloud has no fields; drop --weights {name}"
            raise ValueError(msg)
        data = self.mesh.cell_data if self.on == "cells" else self.mesh.point_data
        if name not in data:
            have = ", ".join(data.keys()) or "none"
            msg = f"{self.source}: no {self.on[:-1]} field {name!r} (available: {have})"
            other = "points" if self.on == "cells" else "cells"
            if name in (self.mesh.point_data if other == "points" else self.mesh.cell_data):
                msg += (
                    f"; {name!r} is a {other[:-1]} field: add --on {other} to partition the "
                    f"mesh's {'vertices' if other == 'points' else 'cells'} weighted by it"
                )
            raise ValueError(msg)
        arr = np.asarray(data[name])
        if arr.ndim != 1:
            msg = f"{self.source}: field {name!r} has shape {arr.shape}; weights need one value"
            raise ValueError(msg)
        return arr

    def default_graph(self) -> str:
        """``"dual"`` on cells the dual graph takes, else ``"knn"``."""
        if self.on == "cells" and dual_graph_supported(self.mesh):
            return "dual"
        return "knn"

    def graph(self, kind: str | None = None, knn: int = 8) -> Any:
        """Adjacency: the dual graph of the cells (default on cells) or a kNN graph."""
        kind = kind or self.default_graph()
        if kind == "dual":
            if self.on != "cells":
                msg = "the dual graph connects cells; use --graph knn when partitioning points"
                raise ValueError(msg)
            if not dual_graph_supported(self.mesh):
                msg = (
                    f"{self.source}: the dual graph needs polygon or volume cells, and this "
                    "mesh has lines, vertices or strips; use --graph knn (a kNN graph of the "
                    "cell centres)"
                )
                raise ValueError(msg)
            if self.weld is None:
                return dual_graph(self.mesh)
            conn, off, types = mesh_connectivity(self.mesh)
            poly = mesh_polyhedra(self.mesh)
            return dual_graph(cells=self.weld.apply(conn), offsets=off, celltypes=types,
                              polyhedra=None if poly is None else poly.renumbered(self.weld))
        if kind == "knn":
            return knn_graph(self.points, knn)
        msg = f"unknown graph {kind!r}; use 'dual' or 'knn'"
        raise ValueError(msg)


def load_geometry(path: str | Path, on: str | None = None) -> Geometry:
    """Read ``path`` (mesh or ``.npy``) and pick what to partition.

    Parameters
    ----------
    path : str or Path
    on : {"cells", "points"}, optional
        Default: cells when the mesh has cells (other than bare vertices), else points.
    """
    p = Path(path)
    if on not in (None, "cells", "points"):
        msg = f"on={on!r} must be 'cells' or 'points'"
        raise ValueError(msg)
    if p.suffix.lower() == ".npy":
        if on == "cells":
            msg = f"{p}: a .npy point cloud has no cells; use --on points"
            raise ValueError(msg)
        pts = read_points(p)
        _check_finite_points(pts, str(p), "points")
        return Geometry(pts, "points", None, str(p))
    mesh = read_mesh(p)
    import pyvista as pv

    only_verts = isinstance(mesh, pv.PolyData) and mesh.n_verts == mesh.n_cells
    has_cells = mesh.n_cells > 0 and not only_verts
    if on is None:
        on = "cells" if has_cells else "points"
    pts = np.asarray(mesh.points, dtype=np.float64)
    if on == "cells":
        if not has_cells:
            msg = f"{p}: the mesh has no cells to partition; use --on points"
            raise ValueError(msg)
        _check_finite_points(pts, str(p), on)
        return Geometry(cell_centers(mesh), "cells", mesh, str(p))
    _check_finite_points(pts, str(p), on)
    return Geometry(pts, "points", mesh, str(p))
