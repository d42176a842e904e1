"""What VTK is allowed to see, and what is checked after it read a file.

VTK's XML readers trust a file's headers: a negative appended offset makes them read the bytes
before an array as its values (a store of 1e15 pressures, exit 0), a count or block header they
believe allocates without bound, and some damage ends in SIGSEGV or SIGABRT inside them. So:

- :func:`read_all_pieces` reads a file of several ``<Piece>`` elements with meshshard's own
  reader, piece by piece, and merges them as VTK does (points appended, connectivity shifted),
  so such files never reach VTK at all;
- :func:`check_before_vtk` validates every header VTK will act on (counts, types, formats,
  appended offsets, array sizes against the counts and the file, compressed block tables, the
  connectivity's length against the offsets, the faces of polyhedra, ASCII text long enough for
  its count) before a file is handed to VTK (layouts meshshard does not decode,
  ``MESHSHARD_READER=vtk``, the CLI's ``partition``/``inspect``), and returns the counts the
  XML declares;
- :func:`check_vtk_output` compares what VTK returned with those counts.

Each raises :class:`~meshshard.io.vtkxml.CorruptVtkXml`, naming the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from meshshard.io.vtkxml import (
    CellMesh,
    CorruptVtkXml,
    UnsupportedVtkXml,
    VtkXmlFile,
    _int_attr,
    _native,
)

__all__ = ["check_before_vtk", "check_vtk_output", "read_all_pieces"]

_CELL_TAGS = {
    "Cells": "NumberOfCells",
    "Polys": "NumberOfPolys",
    "Verts": "NumberOfVerts",
    "Lines": "NumberOfLines",
    "Strips": "NumberOfStrips",
}


def _n_pieces(path: Path) -> int:
    with VtkXmlFile(path, threads=1, piece=0) as f:
        return f.n_pieces


def read_all_pieces(
    path: str | Path, names: Iterable[str], *, threads: int | None = None
) -> CellMesh:
    """Every ``<Piece>`` of ``path`` merged into one mesh, as VTK's readers merge them: points
    of piece ``i`` follow those of pieces ``< i``, its vertex ids are shifted by as many, and
    its cells and cell rows follow theirs. A cell array is kept only when every piece has it.

    Raises
    ------
    CorruptVtkXml
        Any piece is damaged (the message names the file and what is wrong).
    UnsupportedVtkXml
        A piece uses a layout meshshard's reader does not decode.
    """
    path = Path(path)
    names = list(names)
    meshes = []
    for i in range(_n_pieces(path)):
        with VtkXmlFile(path, threads=threads, piece=i) as f:
            meshes.append(f.read(names))
    common = [n for n in names if all(n in m.cell_data for m in meshes)]
    shift = np.cumsum([0] + [m.points.shape[0] for m in meshes])
    ends = np.cumsum([0] + [m.connectivity.size for m in meshes])
    offsets = [np.zeros(1, np.int64)]
    offsets += [m.offsets[1:] + e for m, e in zip(meshes, ends)]
    conn = [m.connectivity.astype(np.int64, copy=False) + s for m, s in zip(meshes, shift)]
    listed = meshes[0].cell_array_names if meshes else []
    return CellMesh(
        points=np.concatenate([m.points for m in meshes]),
        offsets=np.concatenate(offsets),
        connectivity=np.concatenate(conn) if conn else np.zeros(0, np.int64),
        cell_data={n: np.concatenate([m.cell_data[n] for m in meshes]) for n in common},
        cell_array_names=[n for n in listed if all(n in m.cell_array_names for m in meshes)],
        n_other_cells=sum(m.n_other_cells for m in meshes),
    )


def _ascii_bound(f: VtkXmlFile, arr, count: int | None, what: str) -> None:
    """An inline ASCII array holds at most one value per two characters of its text."""
    if arr.attrs.get("format") != "ascii" or count is None:
        return
    room = (arr.end - arr.start + 1) // 2
    if count > room:
        raise CorruptVtkXml(f"{what}: declares {count} values, but its text holds at most {room}")


def _declared(f: VtkXmlFile, arr, what: str) -> int | None:
    """Values an encoded (not ASCII) array's header declares, with the header checked against
    the file."""
    return f._dec.declared(arr, what)


def _check_piece(f: VtkXmlFile, names: set[str]) -> None:
    piece = f.piece_attrs
    n_cells = f.n_cells
    tag_count = {t: _int_attr(piece, k, 0) for t, k in _CELL_TAGS.items()}
    offsets_end: dict[str, int] = {}
    conn_len: dict[str, int | None] = {}
    for arr in f._arrays:
        parent = arr.path[-1]
        name = arr.attrs.get("Name", "")
        if parent == "Points":
            want, what = 3 * f.n_points, "points"
        elif parent in _CELL_TAGS:
            what = f"<{parent}> {name or 'array'}"
            want = tag_count[parent] if name in ("offsets", "types") else None
        elif parent == "CellData" and name in names:
            comps = _int_attr(arr.attrs, "NumberOfComponents", 1, tag=f"cell array {name!r}")
            if comps < 1:
                raise CorruptVtkXml(f"cell array {name!r}: NumberOfComponents={comps}")
            want, what = comps * n_cells, f"cell array {name!r}"
        else:
            continue  # not read by VTK (disabled arrays are not allocated)
        try:
            got = _declared(f, arr, what)
        except UnsupportedVtkXml:
            _ascii_bound(f, arr, want, what)
            continue
        if want is not None and got != want:
            raise CorruptVtkXml(f"{what}: {got} values, expected {want} from the counts in the XML")
        if parent in _CELL_TAGS and name == "connectivity":
            conn_len[parent] = got
        if parent in _CELL_TAGS and name == "offsets" and got:
            ends = _native(f._dec.array(arr, got, what))
            f._dec.finish()
            offsets_end[parent] = int(f._checked_offsets(ends)[-1])
    for parent, end in offsets_end.items():
        have = conn_len.get(parent)
        if have is not None and have != end:
            raise CorruptVtkXml(
                f"<{parent}> offsets end at {end}, but its connectivity holds {have} ids"
            )
    try:  # VTK trusts a polyhedron's face counts (a huge one is a SIGSEGV inside it)
        f.polyhedra()
    except UnsupportedVtkXml:  # ASCII cell arrays: the sizes above are all that is checked
        pass


def check_before_vtk(path: str | Path, names: Iterable[str]) -> tuple[int, int]:
    """Validate every header of VTK XML file ``path`` that VTK's reader would act on, reading
    cell arrays ``names`` (others are disabled); returns the ``(points, cells)`` the XML declares
    over all pieces (cells: every cell, for PolyData also vertices, lines and strips).

    Raises
    ------
    CorruptVtkXml
        Naming the file and the header that is wrong; the file must not reach VTK.
    """
    path = Path(path)
    names = set(names)
    points = cells = 0
    try:
        n = _n_pieces(path)
    except UnsupportedVtkXml as exc:  # another dataset type in a .vtp/.vtu
        raise CorruptVtkXml(f"{exc}: not what a {path.suffix} file holds", path) from None
    for i in range(n):
        with VtkXmlFile(path, threads=1, piece=i) as f, f._named():
            _check_piece(f, names)
            points += f.n_points
            cells += f.n_cells
    return points, cells


def check_vtk_output(path: str | Path, mesh: CellMesh, counts: tuple[int, int]) -> None:
    """An error unless ``mesh`` (what VTK returned) has the points and cells the XML declares."""
    n_points, n_cells = counts
    got = (mesh.points.shape[0], mesh.n_cells)
    if got != (n_points, n_cells):
        raise CorruptVtkXml(
            f"VTK returned {got[0]} points and {got[1]} cells, the XML declares {n_points} and "
            f"{n_cells}",
            path,
        )
