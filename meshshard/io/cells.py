"""Cell topology shared by every consumer of VTK cells: the faces of the linear cell types and
the faces of polyhedra (``VTK_POLYHEDRON``, type 42).

A polyhedron is not described by its points: its faces are listed separately. VTK has two
layouts for them, and files in both are common:

- VTK < 9.4 (and OpenFOAM's ``foamToVTK`` v1912, whose cells are mostly hexahedra with some
  polyhedra): one ``faces`` stream, for each polyhedral cell ``nfaces, (npts, ids...) *
  nfaces``, and ``faceoffsets`` (one per cell: where that cell's stream *ends*, or -1 for a
  cell that is not a polyhedron);
- VTK >= 9.4 (pyvista 0.44+, VTK's XML writers today): ``face_connectivity``/``face_offsets``
  (every face once) and ``polyhedron_to_faces``/``polyhedron_offsets`` (the faces of every
  cell; none for the other cells).

:class:`PolyhedronFaces` holds the second layout, made from either (:meth:`from_legacy`,
:meth:`from_vtk`) and validated before use (:meth:`check`): ids in range, offsets monotone and
consistent, every polyhedron with at least four faces of at least three points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CELL_FACES", "CELL_NVERTS", "VTK_POLYGON", "VTK_POLYHEDRON", "PolyhedronFaces"]

#: VTK's polygon and polyhedron cell type codes
VTK_POLYGON = 7
VTK_POLYHEDRON = 42

# VTK cell type -> (dimension, faces as local vertex ids). 3-D cells share faces, 2-D cells
# share edges. Faces of 3-D cells are ordered counter-clockwise seen from outside (VTK's
# convention), so their vector areas point out of the cell.
CELL_FACES: dict[int, tuple[int, tuple[tuple[int, ...], ...]]] = {
    5: (2, ((0, 1), (1, 2), (2, 0))),  # VTK_TRIANGLE
    8: (2, ((0, 1), (1, 3), (3, 2), (2, 0))),  # VTK_PIXEL
    9: (2, ((0, 1), (1, 2), (2, 3), (3, 0))),  # VTK_QUAD
    10: (3, ((0, 1, 3), (1, 2, 3), (2, 0, 3), (0, 2, 1))),  # VTK_TETRA
    11: (  # VTK_VOXEL
        3,
        ((0, 4, 6, 2), (1, 3, 7, 5), (0, 1, 5, 4), (2, 6, 7, 3), (0, 2, 3, 1), (4, 5, 7, 6)),
    ),
    12: (  # VTK_HEXAHEDRON
        3,
        ((0, 4, 7, 3), (1, 2, 6, 5), (0, 1, 5, 4), (3, 7, 6, 2), (0, 3, 2, 1), (4, 5, 6, 7)),
    ),
    13: (3, ((0, 1, 2), (3, 5, 4), (0, 3, 4, 1), (1, 4, 5, 2), (2, 5, 3, 0))),  # VTK_WEDGE
    14: (3, ((0, 3, 2, 1), (0, 1, 4), (1, 2, 4), (2, 3, 4), (3, 0, 4))),  # VTK_PYRAMID
}
#: vertices of the fixed-size cell types of :data:`CELL_FACES`
CELL_NVERTS = {5: 3, 8: 4, 9: 4, 10: 4, 11: 8, 12: 8, 13: 6, 14: 5}


def _int64(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a).reshape(-1), dtype=np.int64)


@dataclass(frozen=True)
class PolyhedronFaces:
    """The faces of the polyhedral cells of a mesh (VTK 9.4's layout).

    Cell ``i``'s faces are ``cell_faces[cell_offsets[i]:cell_offsets[i + 1]]`` (face ids; none
    for a cell that is not a polyhedron), and face ``f`` is the points
    ``face_connectivity[face_offsets[f]:face_offsets[f + 1]]``.

    Attributes
    ----------
    face_connectivity : ndarray of shape (sum of face sizes,), int64
    face_offsets : ndarray of shape (n_faces + 1,), int64
    cell_faces : ndarray of shape (sum of faces per cell,), int64
    cell_offsets : ndarray of shape (n_cells + 1,), int64

    Examples
    --------
    A cube as a polyhedron (cell 0), following a tetrahedron with no faces listed (cell 1):

    >>> quads = [[0, 3, 2, 1], [4, 5, 6, 7], [0, 1, 5, 4], [1, 2, 6, 5], [2, 3, 7, 6],
    ...          [3, 0, 4, 7]]
    >>> stream = [6] + [x for q in quads for x in [4, *q]]
    >>> pf = PolyhedronFaces.from_legacy(stream, [len(stream), -1])
    >>> pf.n_cells, pf.n_faces, pf.polyhedra().tolist()
    (2, 6, [0])
    """

    face_connectivity: np.ndarray
    face_offsets: np.ndarray
    cell_faces: np.ndarray
    cell_offsets: np.ndarray

    @property
    def n_cells(self) -> int:
        return int(self.cell_offsets.size - 1)

    @property
    def n_faces(self) -> int:
        return int(self.face_offsets.size - 1)

    def polyhedra(self) -> np.ndarray:
        """Ids of the cells with faces listed (the polyhedra)."""
        return np.flatnonzero(np.diff(self.cell_offsets) > 0)

    def widest_face(self) -> int:
        """Points of the largest face (0 without faces)."""
        return int(np.diff(self.face_offsets).max()) if self.n_faces else 0

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_arrays(
        cls, face_connectivity: Any, face_offsets: Any, cell_faces: Any, cell_offsets: Any
    ) -> PolyhedronFaces:
        """From VTK 9.4's four arrays (``face_connectivity``, ``face_offsets``,
        ``polyhedron_to_faces``, ``polyhedron_offsets``), offsets with their leading 0 (as VTK
        holds them in memory; VTK XML files store the end offsets only)."""
        return cls(_int64(face_connectivity), _int64(face_offsets), _int64(cell_faces),
                   _int64(cell_offsets))  # fmt: skip

    @classmethod
    def from_legacy(cls, faces: Any, faceoffsets: Any) -> PolyhedronFaces:
        """From the legacy ``faces`` stream and ``faceoffsets`` (one per cell: where the
        cell's stream ends, -1 for cells that are not polyhedra).

        Raises
        ------
        ValueError
            The stream does not parse (counts running past its end, offsets out of order).
        """
        stream = _int64(faces)
        ends = _int64(faceoffsets)
        n = ends.size
        is_poly = ends >= 0
        poly = np.flatnonzero(is_poly)
        pe = ends[poly]
        if pe.size and ((np.diff(pe) <= 0).any() or pe[-1] > stream.size):
            msg = (
                "faceoffsets of the polyhedra must increase and end within the faces stream "
                f"({stream.size} values)"
            )
            raise ValueError(msg)
        starts = np.concatenate([[0], pe[:-1]])
        # walk every polyhedron's stream in lock step: one face of every cell per round
        nfaces = stream[starts] if starts.size else starts
        if (nfaces < 1).any():
            msg = "a polyhedron in the faces stream has fewer than 1 face"
            raise ValueError(msg)
        # a face takes at least 2 values of the stream (its size, a point): a count the stream
        # cannot hold is refused before anything is allocated by it
        if (nfaces > (pe - starts - 1) // 2).any():
            msg = "the faces stream of a polyhedron is shorter than its face counts"
            raise ValueError(msg)
        total = int(nfaces.sum())
        face_start = np.empty(total, dtype=np.int64)
        face_size = np.empty(total, dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(nfaces)[:-1]]) if nfaces.size else nfaces
        pos = starts + 1
        for j in range(int(nfaces.max()) if nfaces.size else 0):
            live = np.flatnonzero(nfaces > j)
            p = pos[live]
            if (p >= pe[live]).any():
                msg = "the faces stream of a polyhedron is shorter than its face counts"
                raise ValueError(msg)
            k = stream[p]
            if (k < 1).any() or (p + 1 + k > pe[live]).any():
                msg = "a face of a polyhedron runs past the end of its faces stream"
                raise ValueError(msg)
            face_start[first[live] + j] = p + 1
            face_size[first[live] + j] = k
            pos[live] = p + 1 + k
        if (pos != pe).any():
            msg = "the faces stream of a polyhedron is longer than its face counts"
            raise ValueError(msg)
        fo = np.concatenate([[0], np.cumsum(face_size)]).astype(np.int64)
        local = np.arange(fo[-1], dtype=np.int64) - np.repeat(fo[:-1], face_size)
        fc = stream[np.repeat(face_start, face_size) + local]
        counts = np.zeros(n, dtype=np.int64)
        counts[poly] = nfaces
        co = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return cls(fc, fo, np.arange(total, dtype=np.int64), co)

    @classmethod
    def from_vtk(cls, grid: Any) -> PolyhedronFaces | None:
        """The polyhedron faces of a ``vtkUnstructuredGrid`` (pyvista's too), or None when it
        has no polyhedra."""
        from vtkmodules.util.numpy_support import vtk_to_numpy

        if not hasattr(grid, "GetPolyhedronFaces"):
            return None
        get = getattr(grid, "GetCellTypes", None) or grid.GetCellTypesArray  # VTK >= 9.6 / older
        arr = get()
        types = vtk_to_numpy(arr) if arr is not None else None
        if types is None or not (types == VTK_POLYHEDRON).any():
            return None
        faces, locs = grid.GetPolyhedronFaces(), grid.GetPolyhedronFaceLocations()
        if faces is None or locs is None:
            msg = "the grid has polyhedral cells but no polyhedron faces"
            raise ValueError(msg)
        return cls(
            _int64(vtk_to_numpy(faces.GetConnectivityArray())),
            _int64(vtk_to_numpy(faces.GetOffsetsArray())),
            _int64(vtk_to_numpy(locs.GetConnectivityArray())),
            _int64(vtk_to_numpy(locs.GetOffsetsArray())),
        )

    # ------------------------------------------------------------------ checks and views
    def check(self, n_points: int, types: np.ndarray | None = None) -> None:
        """Raise ValueError unless the record is consistent: offsets start at 0, increase and
        end at their arrays' lengths, ids are in range, every polyhedron (a cell of type 42
        in ``types``) has at least 4 faces of at least 3 points, and only polyhedra have faces.
        """
        fo, co = self.face_offsets, self.cell_offsets
        for name, off, arr in (("face_offsets", fo, self.face_connectivity),
                               ("polyhedron_offsets", co, self.cell_faces)):  # fmt: skip
            if off.size == 0 or off[0] != 0 or off[-1] != arr.size or (np.diff(off) < 0).any():
                msg = (
                    f"polyhedron {name} must start at 0, never decrease and end at "
                    f"{arr.size} (the length of the array they index)"
                )
                raise ValueError(msg)
        fc = self.face_connectivity
        if fc.size and (fc.min() < 0 or fc.max() >= n_points):
            bad = int(fc.min()) if fc.min() < 0 else int(fc.max())
            msg = f"a polyhedron face refers to point {bad}, but the mesh has {n_points} points"
            raise ValueError(msg)
        cf = self.cell_faces
        if cf.size and (cf.min() < 0 or cf.max() >= self.n_faces):
            bad = int(cf.min()) if cf.min() < 0 else int(cf.max())
            msg = f"a polyhedron refers to face {bad}, but {self.n_faces} faces are listed"
            raise ValueError(msg)
        if self.n_faces and np.diff(fo).min() < 3:
            msg = "a polyhedron face has fewer than 3 points"
            raise ValueError(msg)
        nf = np.diff(co)
        if types is not None:
            types = np.asarray(types).reshape(-1)
            if types.size != self.n_cells:
                msg = f"polyhedron faces for {self.n_cells} cells, but the mesh has {types.size}"
                raise ValueError(msg)
            is_poly = types == VTK_POLYHEDRON
            if (nf[is_poly] < 4).any():
                i = int(np.flatnonzero(is_poly & (nf < 4))[0])
                msg = f"polyhedral cell {i} has {int(nf[i])} faces; a polyhedron needs >= 4"
                raise ValueError(msg)
            if (nf[~is_poly] > 0).any():
                i = int(np.flatnonzero(~is_poly & (nf > 0))[0])
                msg = f"cell {i} is not a polyhedron but has polyhedron faces listed"
                raise ValueError(msg)

    def renumbered(self, points: Any) -> PolyhedronFaces:
        """The same faces with point ids mapped (``points.apply(ids)`` for an object with an
        ``apply`` method, e.g. a :class:`~meshshard.partition.weld.Weld`, else
        ``points[ids]``)."""
        fc = self.face_connectivity
        fc = points.apply(fc) if hasattr(points, "apply") else np.asarray(points)[fc]
        return PolyhedronFaces(fc, self.face_offsets, self.cell_faces, self.cell_offsets)

    def subset(self, cells: np.ndarray) -> PolyhedronFaces:
        """The faces of ``cells`` only (renumbered: cell ``j`` of the result is
        ``cells[j]``)."""
        cells = _int64(cells)
        co = self.cell_offsets
        nf = co[cells + 1] - co[cells]
        new_co = np.concatenate([[0], np.cumsum(nf)]).astype(np.int64)
        local = np.arange(new_co[-1], dtype=np.int64) - np.repeat(new_co[:-1], nf)
        fids = self.cell_faces[np.repeat(co[cells], nf) + local]
        sizes = self.face_offsets[fids + 1] - self.face_offsets[fids]
        fo = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        loc2 = np.arange(fo[-1], dtype=np.int64) - np.repeat(fo[:-1], sizes)
        fc = self.face_connectivity[np.repeat(self.face_offsets[fids], sizes) + loc2]
        return PolyhedronFaces(fc, fo, np.arange(fids.size, dtype=np.int64), new_co)

    def faces_by_size(self, cells: np.ndarray | None = None):
        """Yield ``(k, verts, owner)``: the faces of ``k`` points of the polyhedra (of
        ``cells``, default all), ``verts`` of shape (m, k) in the file's order, ``owner`` the
        cell of each (m,)."""
        co = self.cell_offsets
        if cells is None:
            owner_all = np.repeat(np.arange(self.n_cells, dtype=np.int64), np.diff(co))
            fids = self.cell_faces
        else:
            cells = _int64(cells)
            nf = co[cells + 1] - co[cells]
            start = np.concatenate([[0], np.cumsum(nf)])[:-1]
            local = np.arange(int(nf.sum()), dtype=np.int64) - np.repeat(start, nf)
            fids = self.cell_faces[np.repeat(co[cells], nf) + local]
            owner_all = np.repeat(cells, nf)
        fo = self.face_offsets
        size = fo[fids + 1] - fo[fids]
        for k in np.unique(size).tolist():
            sel = np.flatnonzero(size == k)
            verts = self.face_connectivity[fo[fids[sel]][:, None] + np.arange(k)]
            yield int(k), verts, owner_all[sel]
