"""Polyhedral test meshes with known answers: a sheared grid of hexahedra where some cells are
written as polyhedra (faces shuffled, some whole cells inward, some faces flipped one by one),
and pairs of cells merged into one 10-face polyhedron (12 points, coplanar face pairs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: a real OpenFOAM export (see tests/data/foam_refined/make.sh)
FOAM_DIR = Path(__file__).resolve().parents[1] / "data" / "foam_refined"
AFFINE = np.array([[1.0, 0.3, 0.0], [0.0, 1.2, 0.1], [0.0, 0.0, 0.8]])
SHIFT = np.array([2.0, -1.0, 0.5])
#: VTK hexahedron faces, outward
HEX_FACES = ((0, 4, 7, 3), (1, 2, 6, 5), (0, 1, 5, 4), (3, 7, 6, 2), (0, 3, 2, 1), (4, 5, 6, 7))


@dataclass
class PolyMesh:
    grid: object  # pyvista.UnstructuredGrid
    faces: list[list[tuple[int, ...]]]  # every cell's faces (point ids), independent of VTK
    volumes: np.ndarray
    centroids: np.ndarray
    kinds: list[str]


def poly_mesh(shape=(5, 4, 3), seed: int = 0) -> PolyMesh:
    import pyvista as pv

    rng = np.random.default_rng(seed)
    nx, ny, nz = shape
    ijk = np.stack(np.meshgrid(np.arange(nx + 1), np.arange(ny + 1), np.arange(nz + 1),
                               indexing="ij"), axis=-1).reshape(-1, 3)  # fmt: skip
    points = ijk @ AFFINE.T + SHIFT

    def pid(i, j, k):
        return (i * (ny + 1) + j) * (nz + 1) + k

    def hex_ids(i, j, k):
        return [pid(i, j, k), pid(i + 1, j, k), pid(i + 1, j + 1, k), pid(i, j + 1, k),
                pid(i, j, k + 1), pid(i + 1, j, k + 1), pid(i + 1, j + 1, k + 1),
                pid(i, j + 1, k + 1)]  # fmt: skip

    det = float(np.linalg.det(AFFINE))
    cells: list[int] = []
    types: list[int] = []
    faces: list[list[tuple[int, ...]]] = []
    vols, cents, kinds = [], [], []
    for i in range(nx):
        for j in range(ny):
            for k in range(nz):
                if j == 0 and i == 1:
                    continue  # merged into cell (0, 0, k)
                h = hex_ids(i, j, k)
                fs = [tuple(h[a] for a in f) for f in HEX_FACES]
                centre = np.array([i + 0.5, j + 0.5, k + 0.5])
                vol = det
                if j == 0 and i == 0:  # a 2 x 1 x 1 box of two cells: 10 faces
                    h2 = hex_ids(1, 0, k)
                    f2 = [tuple(h2[a] for a in f) for f in HEX_FACES]
                    fs = [fs[0], f2[1], fs[2], f2[2], fs[3], f2[3], fs[4], f2[4], fs[5], f2[5]]
                    centre = np.array([1.0, 0.5, k + 0.5])
                    vol = 2 * det
                    kind = "merged"
                else:
                    kind = ("hex", "poly_out", "poly_in", "poly_mixed")[int(rng.integers(4))]
                if kind == "poly_in":
                    fs = [f[::-1] for f in fs]
                elif kind == "poly_mixed":  # some faces flipped, never all or none
                    flip = rng.random(len(fs)) < 0.5
                    flip[0] = not flip[1:].all()
                    fs = [f[::-1] if fl else f for f, fl in zip(fs, flip, strict=True)]
                if kind == "hex":
                    cells += [8, *h]
                    types.append(12)
                else:
                    order = rng.permutation(len(fs))
                    fs = [fs[o] for o in order]
                    stream = [len(fs)] + [x for f in fs for x in (len(f), *f)]
                    cells += [len(stream), *stream]
                    types.append(42)
                faces.append(fs)
                vols.append(vol)
                cents.append(centre @ AFFINE.T + SHIFT)
                kinds.append(kind)
    grid = pv.UnstructuredGrid(np.array(cells), np.array(types, dtype=np.uint8), points)
    grid.cell_data["work"] = np.arange(grid.n_cells, dtype=np.float64)
    return PolyMesh(grid, faces, np.array(vols), np.array(cents), kinds)


def brute_force_pairs(faces: list[list[tuple[int, ...]]]) -> set[tuple[int, int]]:
    """Cells sharing a face (the same point set), both directions, by comparing sets."""
    by_face: dict[frozenset, list[int]] = {}
    for c, fs in enumerate(faces):
        for f in fs:
            by_face.setdefault(frozenset(f), []).append(c)
    return {(a, b) for cs in by_face.values() for a in cs for b in cs if a != b}


def legacy_vtu(path, points, conn, offsets, types, faces, faceoffsets) -> None:
    """An UnstructuredGrid in VTK's pre-9.4 polyhedron layout (``faces``/``faceoffsets``, as
    foamToVTK writes it), inline base64 binary with UInt64 headers; ``offsets`` are the end
    offsets, as in the file."""
    import base64

    def arr(name, a, typ, dt, comps=1):
        a = np.ascontiguousarray(a, dtype=dt).reshape(-1)
        raw = np.array([a.nbytes], dtype="<u8").tobytes() + a.tobytes()
        return (f'<DataArray type="{typ}" Name="{name}" NumberOfComponents="{comps}" '
                f'format="binary">{base64.b64encode(raw).decode()}</DataArray>\n')  # fmt: skip

    text = (
        '<?xml version="1.0"?>\n<VTKFile type="UnstructuredGrid" version="1.0" '
        'byte_order="LittleEndian" header_type="UInt64">\n<UnstructuredGrid>\n'
        f'<Piece NumberOfPoints="{len(points)}" NumberOfCells="{len(types)}">\n'
        f'<Points>{arr("Points", points, "Float64", "<f8", 3)}</Points>\n<Cells>\n'
        + arr("connectivity", conn, "Int64", "<i8") + arr("offsets", offsets, "Int64", "<i8")
        + arr("types", types, "UInt8", "u1") + arr("faces", faces, "Int64", "<i8")
        + arr("faceoffsets", faceoffsets, "Int64", "<i8")
        + "</Cells>\n</Piece>\n</UnstructuredGrid>\n</VTKFile>\n"
    )
    Path(path).write_text(text)


def legacy_arrays(mesh: PolyMesh):
    """``(points, conn, end offsets, types, faces, faceoffsets)`` of ``mesh`` in the legacy
    layout."""
    g = mesh.grid
    conn, ends, stream, foff = [], [], [], []
    for c, fs in enumerate(mesh.faces):
        pts = list(dict.fromkeys(x for f in fs for x in f))
        if g.celltypes[c] == 12:
            pts = list(g.get_cell(c).point_ids)
        conn += pts
        ends.append(len(conn))
        if g.celltypes[c] == 42:
            stream += [len(fs)] + [x for f in fs for x in (len(f), *f)]
            foff.append(len(stream))
        else:
            foff.append(-1)
    return np.asarray(g.points), conn, ends, np.asarray(g.celltypes), stream, foff
