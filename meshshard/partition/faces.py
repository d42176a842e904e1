"""Faces of cells as comparable rows, and the cells that share them: the core of the dual graph.

Every face of every cell becomes a row of its sorted point ids, padded on the left with -1 to
one width (4, or the widest polyhedron face); equal rows are one shared face. Rows are grouped
by a 64-bit hash and checked exactly, so the result never depends on the hash being
collision-free. :func:`meshshard.partition.dual_graph` and the distributed
:func:`meshshard.graph.from_cells` both build on these.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshshard.io.cells import (
    CELL_FACES,
    CELL_NVERTS,
    VTK_POLYGON,
    VTK_POLYHEDRON,
    PolyhedronFaces,
)
from meshshard.partition._validation import unique_int

__all__ = ["cell_faces", "face_width", "row_hash", "shared_face_pairs"]

_VTK_POLYGON = VTK_POLYGON
_CELL_NVERTS = CELL_NVERTS


def _vtk_type_name(code: int) -> str:
    try:
        import pyvista as pv

        return pv.CellType(int(code)).name
    except Exception:  # unknown code or pyvista missing
        return f"type {int(code)}"


def face_width(types: np.ndarray, polyhedra: PolyhedronFaces | None = None) -> int:
    """Columns of :func:`cell_faces`' rows: 4, or the widest polyhedron face when wider."""
    if polyhedra is None or not (np.asarray(types) == VTK_POLYHEDRON).any():
        return 4
    return max(4, polyhedra.widest_face())


def cell_faces(
    conn: np.ndarray,
    off: np.ndarray,
    types: np.ndarray,
    polyhedra: PolyhedronFaces | None = None,
    *,
    width: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every face of every cell as a padded row of sorted vertex ids, and its cell.

    Parameters
    ----------
    conn, off, types
        Flat connectivity, offsets (ncells + 1) and VTK type of every cell.
    polyhedra : PolyhedronFaces, optional
        The faces of the cells of type 42 (needed when there are any).
    width : int, optional
        Columns of the rows (default :func:`face_width`); ranks that compare faces pass the
        same value.

    Returns
    -------
    keys : ndarray of shape (F, width), int64
        Faces of 3-D cells and edges of 2-D cells (padded with -1 on the left; edges carry
        -2 in column 0 so they never match a triangle face). Equal rows = a shared face.
    cells : ndarray of shape (F,), int64
        Index (into ``types``) of the cell of every face.

    Raises
    ------
    ValueError
        Unsupported VTK cell types (named), cells with the wrong vertex count, polyhedra
        without their faces.
    """
    face_rows: list[np.ndarray] = []
    face_cells: list[np.ndarray] = []
    nvert = np.diff(off)
    need = face_width(types, polyhedra)
    if width is None:
        width = need
    elif width < need:
        msg = f"width={width} is narrower than the widest face ({need} points)"
        raise ValueError(msg)
    for code in unique_int(types).tolist():
        sel = np.flatnonzero(types == code)
        if code == _VTK_POLYGON:
            for nv in unique_int(nvert[sel]).tolist():
                ids = sel[nvert[sel] == nv]
                verts = conn[off[ids][:, None] + np.arange(nv)]
                faces = [(i, (i + 1) % nv) for i in range(nv)]
                _add_faces(verts, ids, faces, 2, face_rows, face_cells, width)
            continue
        if code == VTK_POLYHEDRON:
            if polyhedra is None or polyhedra.n_cells != types.size:
                msg = (
                    f"{sel.size} polyhedral cell(s) (VTK type 42) but no faces for them; pass "
                    "the mesh itself, or polyhedra=PolyhedronFaces(...) with one entry per cell"
                )
                raise ValueError(msg)
            for k, verts, owner in polyhedra.faces_by_size(sel):
                _add_faces(verts, owner, [tuple(range(k))], 3, face_rows, face_cells, width)
            continue
        if code not in CELL_FACES:
            msg = (
                f"unsupported VTK cell type {_vtk_type_name(code)} (code {code}) in "
                f"{sel.size} cell(s); supported: triangle, quad, pixel, polygon, tetra, "
                "hexahedron, voxel, wedge, pyramid, polyhedron (linear cells); convert or drop "
                "the others"
            )
            raise ValueError(msg)
        nv = _CELL_NVERTS[code]
        if (nvert[sel] != nv).any():
            msg = f"cells of VTK type {_vtk_type_name(code)} must have {nv} vertices"
            raise ValueError(msg)
        verts = conn[off[sel][:, None] + np.arange(nv)]
        dim, faces = CELL_FACES[code]
        _add_faces(verts, sel, faces, dim, face_rows, face_cells, width)
    if not face_rows:
        return np.zeros((0, width), dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(face_rows), np.concatenate(face_cells).astype(np.int64)


def shared_face_pairs(keys: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of cells that share a face: every cell with every later cell listing the same
    face row (runs are usually length 2; non-manifold faces give longer runs).

    Parameters
    ----------
    keys : ndarray of shape (F, W)
        Face rows as :func:`cell_faces` makes them.
    cells : ndarray of shape (F,)
        Any cell id of every face row.

    Returns
    -------
    (ndarray, ndarray)
        Cell ids of both sides, one entry per (face, pair).
    """
    if keys.shape[0] < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = _group_equal_rows(keys)
    keys, cells = keys[order], cells[order]
    same = (keys[1:] == keys[:-1]).all(axis=1)
    rows: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    cols: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    run = same.copy()
    d = 1
    while run.any():
        i = np.flatnonzero(run)
        rows.append(cells[i])
        cols.append(cells[i + d])
        d += 1
        if d >= keys.shape[0]:
            break
        run = run[:-1] & same[d - 1 :]
    return np.concatenate(rows), np.concatenate(cols)


_HASH_MIX = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)


def row_hash(keys: np.ndarray) -> np.ndarray:
    """One 64-bit hash per row of ``keys`` (F, W), the same on every process for equal rows.

    The first four columns use fixed multipliers (so 4-wide rows hash as they always have);
    wider rows use further odd multipliers from a splitmix-style sequence.
    """
    k = keys.astype(np.uint64) + np.uint64(2)  # padding ids -2/-1 become 0/1
    h = np.zeros(k.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in range(k.shape[1]):
            mult = _HASH_MIX[col] if col < 4 else (0x9E3779B97F4A7C15 * (col + 1)) & (2**64 - 1)
            h ^= k[:, col] * np.uint64(mult | 1)
            h ^= h >> np.uint64(29)
    return h


def _group_equal_rows(keys: np.ndarray) -> np.ndarray:
    """A permutation that makes equal rows of ``keys`` (F, W) contiguous.

    Sorting one 64-bit hash of each row is ~8x faster than ``np.lexsort`` over four columns.
    Equal rows have equal hashes, so they share a run of the hash order; runs of three or more
    rows (non-manifold faces, or hash collisions) are re-sorted exactly by all columns, so the
    result never depends on the hash being collision-free.
    """
    h = row_hash(keys)
    order = np.argsort(h)
    hs = h[order]
    start = np.empty(hs.size, dtype=bool)
    start[:1] = True
    np.not_equal(hs[1:], hs[:-1], out=start[1:])
    run = np.cumsum(start) - 1
    long = np.bincount(run)[run] >= 3
    if long.any():
        sub = np.flatnonzero(long)  # whole runs, contiguous in hash order
        ks = keys[order[sub]]
        cols = tuple(ks[:, j] for j in range(ks.shape[1] - 1, -1, -1))
        fix = np.lexsort((*cols, hs[sub]))
        order[sub] = order[sub][fix]
    return order


def _add_faces(
    verts: np.ndarray,
    cell_ids: np.ndarray,
    faces: Any,
    dim: int,
    out_rows: list[np.ndarray],
    out_cells: list[np.ndarray],
    width: int,
) -> None:
    """Append the sorted, padded vertex ids of every face of ``verts`` (ncells, nverts)."""
    for face in faces:
        f = np.sort(verts[:, list(face)], axis=1)
        pad = np.full((f.shape[0], width), -1, dtype=np.int64)
        pad[:, width - f.shape[1] :] = f
        if dim == 2:
            pad[:, 0] = -2  # edges never match a (padded) triangle face of a 3-D cell
        out_rows.append(pad)
        out_cells.append(cell_ids)
