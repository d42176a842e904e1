"""Read one DrivaerML run directory into numpy arrays (original cell order).

A run directory ``run_<i>/`` holds ``boundary_<i>.vtp`` (surface, cell data), ``volume_<i>.vtu``
(volume, cell data) and ``drivaer_<i>.stl`` (the body). :func:`read_run` returns surface cell
centres, normals, areas and non-dimensional fields, volume cell centres and fields, and the STL
(vertices, triangles, centres, areas).

Reading. VTK XML files (``.vtp``, ``.vtu``) are read by :mod:`meshshard.io.vtkxml`,
which decodes only the points, the cells and the arrays named in the schema, decompressing in
parallel (zlib, LZ4, lzma); files of several pieces are read piece by piece and merged
(:mod:`meshshard.io.vtkguard`). Files in a layout it does not decode (ASCII) and other
formats go through VTK with every other array disabled before the file is parsed. A file
meshshard's reader finds damaged is never handed to VTK (whose readers can crash or allocate
without bound on one): it fails with a :class:`~meshshard.io.errors.InputFileError`
naming the file. Set ``MESHSHARD_READER=vtk`` to send every file through VTK; an XML file's
headers are then validated first, the same way, and VTK's output is checked against them.

Validation. Whichever reader was used, what it returns is checked before anything is computed
or written: point coordinates finite, offsets starting at 0, non-decreasing and ending at the
connectivity's length, vertex ids in range, every cell array one row per cell; fields finite
(or, with ``drop_nan``, the cells holding NaN/inf dropped). Every failure is an
:class:`~meshshard.io.errors.InputFileError` whose message starts with the file.

Memory. A surface's arrays are decoded whole. A volume is streamed (through meshshard's
reader): its fields and connectivity are decoded a few pieces at a time, so besides the output
only the points and the cell offsets are held whole; raw appended data (VTK's ``appended`` mode
without compression) is memory-mapped and its pages released once read. With
``max_volume_cells`` the centres and fields of only a random (seeded) subset of volume cells
are kept. Through VTK (fallback or ``MESHSHARD_READER=vtk``) the whole geometry and the
requested arrays are held.

Length (~660 lines): the DrivaerML reader in one place: VTK fall-back, field selection, the NaN
policy and volume streaming all act on the same schema and the same validated cells.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meshshard.datasets.conventions import orientation, record
from meshshard.datasets.reference import geo_ref_path, run_reference
from meshshard.datasets.schema import DRIVAERML, DatasetSchema, FieldSpec
from meshshard.io.errors import InputFileError
from meshshard.io.geometry import (
    cell_centres,
    polygon_geometry,
    streamed_centres,
    vtk_cells,
)
from meshshard.io.stl import StlData, read_stl
from meshshard.io.validate import check_points, require_file, validate_cells
from meshshard.io.vtkguard import check_before_vtk, check_vtk_output, read_all_pieces
from meshshard.io.vtklog import capture_vtk_output
from meshshard.io.vtkxml import (
    CellMesh,
    SeveralPieces,
    UnsupportedVtkXml,
    VtkXmlFile,
    read_cells,
)

__all__ = [
    "CellData",
    "RunData",
    "SurfaceData",
    "VolumeData",
    "file_fingerprint",
    "read_run",
    "read_surface",
    "read_volume",
    "run_index",
]

log = logging.getLogger(__name__)

_MIB = 1 << 20


def file_fingerprint(path: str | Path) -> dict:
    """``{"name", "size", "mtime_ns", "sha256"}`` of a source file; the hash covers the first
    and the last MiB only (plus the size), so it is cheap on multi-GB volume files yet catches
    replaced, truncated or re-exported files."""
    path = Path(path)
    st = path.stat()
    h = hashlib.sha256(str(st.st_size).encode())
    with open(path, "rb") as fh:
        h.update(fh.read(_MIB))
        if st.st_size > 2 * _MIB:
            fh.seek(st.st_size - _MIB)
            h.update(fh.read(_MIB))
        elif st.st_size > _MIB:
            h.update(fh.read())
    return {
        "name": path.name,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": h.hexdigest(),
    }


@dataclass
class CellData:
    """The cells of one part of a run; row ``j`` is source cell ``source_index[j]``.

    Attributes
    ----------
    centers : ndarray of shape (n, 3), float32
    fields : ndarray of shape (n, F), float32, non-dimensional
    columns : dict[str, list[int]]
        Field name -> ``[start, stop)`` columns of ``fields``.
    scales : dict[str, float]
        Field name -> the factor the raw values were divided by.
    source_index : ndarray of shape (n,), int64
    n_source_cells : int
    dropped_nan : int
    """

    centers: np.ndarray
    fields: np.ndarray
    columns: dict[str, list[int]]
    scales: dict[str, float]
    source_index: np.ndarray
    n_source_cells: int
    dropped_nan: int = 0


@dataclass
class SurfaceData(CellData):
    """Surface cells of one run: :class:`CellData` with each cell's unit normal and area.

    Attributes
    ----------
    normals : ndarray of shape (n, 3), float32
    areas : ndarray of shape (n,), float32
    """

    normals: np.ndarray = field(kw_only=True)
    areas: np.ndarray = field(kw_only=True)
    #: the conventions the arrays hold and what the file held
    #: (:func:`meshshard.datasets.conventions.record`)
    conventions: dict = field(kw_only=True, default_factory=dict)


@dataclass
class VolumeData(CellData):
    """Volume cells of one run (:class:`CellData`)."""


@dataclass
class RunData:
    """Everything read from one run directory."""

    name: str
    index: int
    surface: SurfaceData | None
    volume: VolumeData | None
    stl: StlData | None
    length: float | None
    sources: dict[str, dict] = field(default_factory=dict)
    #: reference values (``aRef``, ``lRef``, ``from``): see
    #: :func:`~meshshard.datasets.reference.run_reference`
    reference: dict | None = None


def run_index(run_dir: str | Path, schema: DatasetSchema = DRIVAERML) -> int:
    """``12`` for ``.../run_12``; a clear error for any other name."""
    name = Path(run_dir).name
    m = re.fullmatch(re.escape(schema.run_prefix) + r"(\d+)", name)
    if not m:
        msg = (
            f"{run_dir}: run directories must be named {schema.run_prefix}<number> "
            f"(e.g. {schema.run_prefix}1); rename it or pass a DatasetSchema(run_prefix=...)"
        )
        raise ValueError(msg)
    return int(m.group(1))


#: ``vtk`` sends every file through VTK's readers (default ``auto``: meshshard's XML reader first)
READER_ENV = "MESHSHARD_READER"
_XML_READERS = {".vtp": "vtkXMLPolyDataReader", ".vtu": "vtkXMLUnstructuredGridReader"}


def _corrupt(path: Path, exc: BaseException, vtk_said: str = "") -> InputFileError:
    """The one-line error for a file VTK could not read; ``vtk_said`` is VTK's own output
    (captured by :func:`meshshard.io.vtklog.capture_vtk_output`), preferred when present."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    first = vtk_said or first
    msg = f"{path}: truncated or corrupt VTK file ({first[:300]}); re-export or re-download it"
    return InputFileError(msg, path)


def _own_reader(path: Path, suffixes) -> bool:
    """Whether ``path`` goes to meshshard's XML reader first (not with MESHSHARD_READER=vtk)."""
    return path.suffix.lower() in suffixes and os.environ.get(READER_ENV, "auto") != "vtk"


def _require_cells(path: Path, mesh) -> None:
    if mesh is None or mesh.n_cells == 0:
        msg = f"{path}: has 0 cells; the file is empty, truncated or not a cell mesh"
        raise InputFileError(msg, path)


def _read_cells(
    path: Path, specs: tuple[FieldSpec, ...], *, polys: bool, piece: int | None = None
) -> tuple[CellMesh, tuple[FieldSpec, ...]]:
    """Points, cells (the polygons when ``polys``) and ``specs``' cell arrays of ``path``, and
    the specs present.

    VTK XML files go through meshshard's own reader (:mod:`meshshard.io.vtkxml`: only
    the named arrays are decoded, in parallel); a file in a layout it does not decode -- ASCII
    data, LZ4, several pieces -- is read by VTK. A damaged file raises
    :class:`~meshshard.io.vtkxml.CorruptVtkXml` and never reaches VTK. With ``piece``
    only that ``<Piece>`` is read, by meshshard's reader only (VTK would merge the pieces).
    """
    if piece is not None:
        return _checked(path, read_cells(path, [s.array for s in specs], piece=piece), specs)
    if _own_reader(path, _XML_READERS):
        try:
            mesh = read_cells(path, [s.array for s in specs])
        except SeveralPieces:  # merged by meshshard's reader: such files never reach VTK
            return _checked(path, read_all_pieces(path, [s.array for s in specs]), specs)
        except UnsupportedVtkXml as exc:
            log.debug("%s: read with VTK (%s)", path, exc)
        else:
            return _checked(path, mesh, specs)
    return _checked(path, _read_vtk(path, specs, polys), specs)


def _checked(
    path: Path, mesh: CellMesh, specs: tuple[FieldSpec, ...]
) -> tuple[CellMesh, tuple[FieldSpec, ...]]:
    """``mesh`` after :func:`validate_cells`, and the specs it holds."""
    _require_cells(path, mesh)
    present = _fields_present(path, specs, mesh.cell_data, mesh.cell_array_names)
    validate_cells(path, mesh)
    return mesh, present


def _fields_present(
    path: Path, specs: tuple[FieldSpec, ...], have, listed: list[str]
) -> tuple[FieldSpec, ...]:
    """The specs whose arrays are in ``have``; an error naming the file's arrays (``listed``)
    when a required one is missing."""
    missing = [s.array for s in specs if s.required and s.array not in have]
    if missing:
        msg = (
            f"{path}: cell field(s) {missing} missing; the file has {listed}. "
            "Fix the file or map its names with --fields FILE=SCHEMA,... "
            "(DatasetSchema.with_fields)"
        )
        raise InputFileError(msg, path)
    return tuple(s for s in specs if s.array in have)


def _read_vtk(path: Path, specs: tuple[FieldSpec, ...], polys: bool) -> CellMesh:
    """:func:`_read_cells` through VTK's readers. An XML file's headers are validated first
    (:func:`~meshshard.io.vtkguard.check_before_vtk`: a damaged one never reaches VTK)
    and VTK's output is compared with the counts they declare."""
    counts = None
    if path.suffix.lower() in _XML_READERS:
        counts = check_before_vtk(path, [s.array for s in specs])
        mesh, names = _read_xml_vtk(path, specs)
    else:
        mesh, names = _read_cells_generic(path, specs)
    if polys:
        offsets, conn = vtk_cells(mesh.GetPolys())
        other = mesh.GetNumberOfCells() - mesh.GetNumberOfPolys()
    else:
        offsets, conn = vtk_cells(mesh.GetCells())
        other = 0
    out = CellMesh(
        points=np.asarray(mesh.points),
        offsets=offsets,
        connectivity=conn,
        cell_data={s.array: np.asarray(mesh.cell_data[s.array]) for s in specs
                   if s.array in names},
        cell_array_names=names,
        n_other_cells=other,
    )
    if counts is not None:
        check_vtk_output(path, out, counts)
    return out


def _read_xml_vtk(path: Path, specs: tuple[FieldSpec, ...]):
    """A VTK XML file read by VTK in one pass, only ``specs``' cell arrays enabled; returns
    (mesh, names of every cell array in the file).

    The selection is set before the header is parsed (unknown arrays default to off): changing
    it after the header is known parses it again, ~0.35 s on an 8.8M-cell surface.
    """
    import pyvista as pv
    from vtkmodules import vtkIOXML

    try:
        with capture_vtk_output() as said, pv.VtkErrorCatcher(raise_errors=True):
            reader = getattr(vtkIOXML, _XML_READERS[path.suffix.lower()])()
            reader.SetFileName(str(path))
            reader.GetPointDataArraySelection().SetUnknownArraySetting(0)
            cells = reader.GetCellDataArraySelection()
            cells.SetUnknownArraySetting(0)
            for s in specs:
                cells.EnableArray(s.array)
            reader.Update()
        mesh = pv.wrap(reader.GetOutput())
    except (RuntimeError, OSError) as exc:
        raise _corrupt(path, exc, said.summary()) from exc
    _require_cells(path, mesh)
    read = set(mesh.cell_data.keys())
    names = [cells.GetArrayName(i) for i in range(cells.GetNumberOfArrays())]
    # disabled names were discovered in the file; enabled ones are in it iff they were read
    return mesh, [n for n in names if n in read or not cells.ArrayIsEnabled(n)]


def _read_cells_generic(path: Path, specs: tuple[FieldSpec, ...]):
    """Any format pyvista reads (legacy .vtk, ...): selection through pyvista's reader."""
    import pyvista as pv

    try:
        with capture_vtk_output() as said, pv.VtkErrorCatcher(raise_errors=True):
            reader = pv.get_reader(str(path))
            available = list(reader.cell_array_names)
            point_arrays = list(reader.point_array_names)
            present = _fields_present(path, specs, available, available)  # ValueError
            if point_arrays or len(present) < len(available):
                # changing the selection re-parses the XML header (~0.6 s CPU on an 8.8M-cell
                # surface), so only when there is something to skip
                reader.disable_all_point_arrays()
                reader.disable_all_cell_arrays()
                for s in present:
                    reader.enable_cell_array(s.array)
            mesh = reader.read()  # pyvista raises VTKExecutionError (a RuntimeError) on errors
    except (RuntimeError, OSError) as exc:
        raise _corrupt(path, exc, said.summary()) from exc
    _require_cells(path, mesh)
    return mesh, available


def _fields(
    path: Path,
    n_cells: int,
    pieces_of: Callable[[str], Iterable[tuple[int, np.ndarray]]],
    specs: tuple[FieldSpec, ...],
    schema: DatasetSchema,
    length: float | None,
    rows: np.ndarray | None,
) -> tuple[np.ndarray, dict[str, list[int]], dict[str, float]]:
    """Non-dimensional fields (rows ``rows`` only, when given) from ``pieces_of(name)``, which
    yields ``(first row, values)`` pieces of one cell array in order (one piece: whole)."""
    n = n_cells if rows is None else rows.size
    width = sum(s.components for s in specs)
    out = np.empty((n, width), dtype=np.float32)
    columns: dict[str, list[int]] = {}
    scales: dict[str, float] = {}
    col = 0
    for s in specs:
        scale = schema.scale(s.kind, length)
        dst = out[:, col : col + s.components]
        for r0, arr in pieces_of(s.array):
            arr = arr.reshape(arr.shape[0], -1)
            if arr.shape[1] != s.components:
                msg = (
                    f"{path}: field {s.name!r} has {arr.shape[1]} components, the schema "
                    f"expects {s.components}; fix FieldSpec({s.name!r}, components=...)"
                )
                raise InputFileError(msg, path)
            r1 = r0 + arr.shape[0]
            # straight into the output columns: no temporary of the whole field
            if rows is None:
                np.multiply(arr, np.float32(1.0 / scale), out=dst[r0:r1])
            else:
                lo, hi = np.searchsorted(rows, [r0, r1])
                np.multiply(arr[rows[lo:hi] - r0], np.float32(1.0 / scale), out=dst[lo:hi])
        columns[s.name] = [col, col + s.components]
        scales[s.name] = scale
        col += s.components
    return out, columns, scales


def _whole(cell_data: dict[str, np.ndarray]) -> Callable[[str], list[tuple[int, np.ndarray]]]:
    """``pieces_of`` for :func:`_fields` when the arrays are in memory: one piece each."""
    return lambda name: [(0, cell_data[name])]


def _nan_rows(path: Path, fields: np.ndarray, columns: dict, drop_nan: bool) -> np.ndarray | None:
    """Rows to keep (None = all) after the NaN policy; raises when NaNs are not to be dropped."""
    if fields.size == 0 or np.isfinite(fields.sum(dtype=np.float64)):
        return None  # any NaN/inf would make the sum non-finite: no per-value mask needed
    bad = ~np.isfinite(fields)
    if not bad.any():
        return None
    if not drop_nan:
        counts = {
            name: int(bad[:, a:b].any(axis=1).sum())
            for name, (a, b) in columns.items()
            if bad[:, a:b].any()
        }
        desc = ", ".join(f"{name}: {c} cells" for name, c in counts.items())
        msg = (
            f"{path}: non-finite (NaN/inf) field values in {desc} of {fields.shape[0]}; "
            "pass drop_nan=True (meshshard preprocess --drop-nan) to drop those cells"
        )
        raise InputFileError(msg, path)
    return np.flatnonzero(~bad.any(axis=1))


def read_surface(
    path: str | Path,
    *,
    schema: DatasetSchema = DRIVAERML,
    length: float | None = None,
    drop_nan: bool = False,
    piece: int | None = None,
) -> SurfaceData:
    """Surface cell centres, normals, areas and non-dimensional fields of a ``.vtp`` file
    (with ``piece``: of that ``<Piece>`` only; ``source_index`` then counts its cells)."""
    path = Path(path)
    require_file(path, "surface")
    mesh, specs = _read_cells(path, schema.surface_fields, polys=True, piece=piece)
    if mesh.offsets.size <= 1:
        msg = f"{path}: has 0 cells (no polygons); the file is empty or truncated"
        raise ValueError(msg)
    if mesh.n_other_cells:
        msg = (
            f"{path}: {mesh.n_other_cells} cells are not polygons (vertices, lines or strips); "
            "a boundary file must hold polygons only (run pyvista's triangulate/clean first)"
        )
        raise ValueError(msg)
    fields, columns, scales = _fields(
        path, mesh.n_cells, _whole(mesh.cell_data), specs, schema, length, None
    )
    n = mesh.n_cells
    points, offsets, conn = mesh.points, mesh.offsets, mesh.connectivity
    del mesh
    keep = _nan_rows(path, fields, columns, drop_nan)
    centers, normals, areas = polygon_geometry(points, offsets, conn)
    del points, offsets, conn
    if keep is not None:
        centers, fields, normals, areas = centers[keep], fields[keep], normals[keep], areas[keep]
        log.warning("%s: dropped %d cells with NaN fields", path, n - keep.size)
    normals, conventions = _to_canonical(path, schema, centers, normals, areas, fields,
                                         columns, whole=piece is None)
    return SurfaceData(
        centers=centers.astype(np.float32, copy=False),
        normals=normals.astype(np.float32, copy=False),
        areas=areas.astype(np.float32, copy=False),
        fields=fields,
        columns=columns,
        scales=scales,
        source_index=np.arange(n, dtype=np.int64) if keep is None else keep.astype(np.int64),
        n_source_cells=n,
        dropped_nan=0 if keep is None else n - keep.size,
        conventions=conventions,
    )


def _to_canonical(path: Path, schema: DatasetSchema, centers: np.ndarray, normals: np.ndarray,
                  areas: np.ndarray, fields: np.ndarray, columns: dict, *, whole: bool
                  ) -> tuple[np.ndarray, dict]:
    """Normals turned into the body and wall shear made the stress on the fluid (in place for
    the shear), as :mod:`~meshshard.datasets.conventions` says; returns the normals and the
    record. One piece of a file cannot show its orientation: with ``normals="auto"`` its
    normals stay as the file's winding gives them, and the record says so."""
    if schema.shear == "on_body":
        for spec in schema.surface_fields:
            if spec.kind == "wall_shear" and spec.name in columns:
                a, b = columns[spec.name]
                np.negative(fields[:, a:b], out=fields[:, a:b])
    if not whole and schema.normals == "auto":
        rec = record(None, schema.shear)
        rec["normals"] = "as the file's winding (one piece: orientation not checked)"
        return normals, rec
    found = orientation(path, centers, normals, areas, schema.normals)
    if found["flip"]:
        normals = np.negative(normals)
        log.info("%s: normals point out of the body (%s): flipped", path, found["from"])
    return normals, record(found, schema.shear)


def read_volume(
    path: str | Path,
    *,
    schema: DatasetSchema = DRIVAERML,
    length: float | None = None,
    drop_nan: bool = False,
    max_cells: int | None = None,
    seed: int = 0,
    piece: int | None = None,
) -> VolumeData:
    """Volume cell centres and non-dimensional fields of a ``.vtu`` file.

    ``max_cells`` keeps a seeded random subset of that many cells (sorted by source index);
    only their centres are computed and only their field rows are kept. With ``piece``, only
    that ``<Piece>`` is read (by meshshard's reader; ``source_index`` counts its cells).
    """
    path = Path(path)
    require_file(path, "volume")
    if max_cells is not None and max_cells < 1:
        msg = f"max_cells={max_cells} must be >= 1 (or None for every cell)"
        raise ValueError(msg)
    if piece is not None:
        with VtkXmlFile(path, piece=piece) as f:
            return _volume_streamed(path, f, schema, length, drop_nan, max_cells, seed)
    specs = schema.volume_fields
    whole = None
    if _own_reader(path, (".vtu",)):
        try:
            with VtkXmlFile(path) as f:
                return _volume_streamed(path, f, schema, length, drop_nan, max_cells, seed)
        except SeveralPieces:  # merged by meshshard's reader: such files never reach VTK
            whole = read_all_pieces(path, [s.array for s in specs])
        except UnsupportedVtkXml as exc:
            log.debug("%s: read with VTK (%s)", path, exc)
    if whole is None:
        whole = _read_vtk(path, specs, polys=False)
    mesh, specs = _checked(path, whole, specs)
    points, offsets, conn = mesh.points, mesh.offsets, mesh.connectivity
    return _volume(
        path,
        mesh.n_cells,
        _whole(mesh.cell_data),
        lambda cells: cell_centres(points, offsets, conn, cells),
        specs,
        schema,
        length,
        drop_nan,
        max_cells,
        seed,
    )


#: rows of a volume cell array, and vertex ids of its connectivity, decoded at a time
_PIECE_ROWS = 1 << 19
_PIECE_IDS = 1 << 21


def _volume_streamed(
    path: Path,
    f: VtkXmlFile,
    schema: DatasetSchema,
    length: float | None,
    drop_nan: bool,
    max_cells: int | None,
    seed: int,
) -> VolumeData:
    """:func:`read_volume` from pieces of the file: besides the output it holds the points,
    the offsets and a few pieces, never the whole connectivity or the whole fields."""
    if f.kind != "UnstructuredGrid":
        msg = f"{path}: holds {f.kind}, not an UnstructuredGrid; a volume file must be a .vtu grid"
        raise InputFileError(msg, path)
    if f.n_cells == 0:
        msg = f"{path}: has 0 cells; the file is empty, truncated or not a cell mesh"
        raise InputFileError(msg, path)
    names = f.cell_array_names
    specs = _fields_present(path, schema.volume_fields, names, names)
    # the declared sizes against the counts and the file, before outputs sized by them exist
    f.check([s.array for s in specs])
    f.offsets()

    def centres(cells: np.ndarray | None) -> np.ndarray:
        points = f.points()
        check_points(path, points)
        return streamed_centres(points, f.offsets(), f.pieces(None, _PIECE_IDS), cells)

    return _volume(
        path,
        f.n_cells,
        lambda name: f.pieces(name, _PIECE_ROWS),
        centres,
        specs,
        schema,
        length,
        drop_nan,
        max_cells,
        seed,
    )


def _volume(
    path: Path,
    n: int,
    pieces_of: Callable[[str], Iterable[tuple[int, np.ndarray]]],
    centres: Callable[[np.ndarray | None], np.ndarray],
    specs: tuple[FieldSpec, ...],
    schema: DatasetSchema,
    length: float | None,
    drop_nan: bool,
    max_cells: int | None,
    seed: int,
) -> VolumeData:
    rows = None
    if max_cells is not None and max_cells < n:
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(n, size=max_cells, replace=False)).astype(np.int64)
    fields, columns, scales = _fields(path, n, pieces_of, specs, schema, length, rows)
    keep = _nan_rows(path, fields, columns, drop_nan)
    source = np.arange(n, dtype=np.int64) if rows is None else rows
    dropped = 0
    if keep is not None:
        dropped = fields.shape[0] - keep.size
        fields, source = fields[keep], source[keep]
        log.warning("%s: dropped %d cells with NaN fields", path, dropped)
    centers = centres(None if source.size == n else source)
    return VolumeData(
        centers=centers.astype(np.float32, copy=False),
        fields=fields,
        columns=columns,
        scales=scales,
        source_index=source,
        n_source_cells=n,
        dropped_nan=dropped,
    )


def read_run(
    run_dir: str | Path,
    *,
    schema: DatasetSchema = DRIVAERML,
    surface: bool = True,
    volume: bool = True,
    drop_nan: bool = False,
    max_volume_cells: int | None = None,
    seed: int = 0,
    reference_area: float | None = None,
) -> RunData:
    """Read a DrivaerML run directory.

    Parameters
    ----------
    run_dir : path
        ``.../run_<i>`` holding the schema's files.
    schema : DatasetSchema
        File names, field names, ``u_inf``, ``rho``.
    surface, volume : bool
        Which parts to read (the STL is read whenever present).
    drop_nan : bool
        Drop cells with non-finite field values instead of raising.
    max_volume_cells : int, optional
        Keep at most this many volume cells (seeded random subset).
    seed : int
        Seed for the subset.
    reference_area : float, optional
        The run's reference area (m^2); default: its ``geo_ref_<i>.csv`` ``aRef``, if any.

    Returns
    -------
    RunData

    Raises
    ------
    FileNotFoundError
        A required file is missing (named).
    ValueError
        Missing fields, corrupt/truncated files, zero cells, NaN values (without ``drop_nan``).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        msg = f"{run_dir}: not a directory"
        raise FileNotFoundError(msg)
    i = run_index(run_dir, schema)
    sources: dict[str, dict] = {}
    stl = None
    stl_path = run_dir / schema.stl_file.format(i=i)
    if stl_path.is_file():
        stl = read_stl(stl_path)
        sources["stl"] = file_fingerprint(stl_path)
    length = schema.length if schema.length is not None else (stl.length if stl else None)
    read_specs = (schema.surface_fields if surface else ()) + (
        schema.volume_fields if volume else ()
    )
    uses_length = any(s.kind == "nut" for s in read_specs)
    if schema.length is None and stl is not None and uses_length and not (
        np.isfinite(length) and length > 0
    ):
        msg = (
            f"{stl_path}: the body's extent along x is {length}, so it gives no length scale for "
            "nut; fix the STL or set DatasetSchema(length=...)"
        )
        raise InputFileError(msg, stl_path)
    surf = vol = None
    if surface:
        p = run_dir / schema.surface_file.format(i=i)
        surf = read_surface(p, schema=schema, length=length, drop_nan=drop_nan)
        sources["surface"] = file_fingerprint(p)
    if volume:
        p = run_dir / schema.volume_file.format(i=i)
        vol = read_volume(
            p,
            schema=schema,
            length=length,
            drop_nan=drop_nan,
            max_cells=max_volume_cells,
            seed=seed,
        )
        sources["volume"] = file_fingerprint(p)
    log.debug("read %s (pid %d)", run_dir, os.getpid())
    ref = run_reference(run_dir, reference_area)
    ref_file = geo_ref_path(run_dir)
    if ref_file is not None:
        sources["geo_ref"] = file_fingerprint(ref_file)
    return RunData(run_dir.name, i, surf, vol, stl, length, sources, ref)
