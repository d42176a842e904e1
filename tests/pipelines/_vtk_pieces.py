"""A minimal writer of VTK XML meshes with several ``<Piece>`` elements (inline base64 binary,
UInt32 headers), for the tests of reading pieces: every piece holds all points and a
consecutive range of the cells."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np

_TYPES = {np.dtype(np.float32): "Float32", np.dtype(np.float64): "Float64",
          np.dtype(np.int64): "Int64", np.dtype(np.uint8): "UInt8"}  # fmt: skip
_CELL_TYPE = {4: 10, 5: 14, 6: 13, 8: 12}  # tetra, pyramid, wedge, hexahedron


def _array(a: np.ndarray, name: str = "", comps: int = 1) -> str:
    a = np.ascontiguousarray(a)
    raw = np.uint32(a.nbytes).tobytes() + a.tobytes()
    named = f' Name="{name}"' if name else ""
    return (f'<DataArray type="{_TYPES[a.dtype]}"{named} NumberOfComponents="{comps}" '
            f'format="binary">{base64.b64encode(raw).decode()}</DataArray>\n')  # fmt: skip


def write_pieces(path: Path, mesh, bounds: list[int], *, volume: bool) -> None:
    """Write ``mesh`` (a :class:`~meshshard.io.vtkxml.CellMesh`) with pieces holding
    cells ``[bounds[i], bounds[i + 1])``."""
    kind = "UnstructuredGrid" if volume else "PolyData"
    out = [f'<?xml version="1.0"?>\n<VTKFile type="{kind}" version="1.0" '
           f'byte_order="LittleEndian" header_type="UInt32">\n<{kind}>\n']  # fmt: skip
    pts = np.asarray(mesh.points, dtype=np.float32)
    for a, b in zip(bounds, bounds[1:]):
        off = mesh.offsets[a : b + 1]
        conn = mesh.connectivity[off[0] : off[-1]].astype(np.int64)
        ends = (off[1:] - off[0]).astype(np.int64)
        count = "NumberOfCells" if volume else "NumberOfPolys"
        extra = "" if volume else ' NumberOfVerts="0" NumberOfLines="0" NumberOfStrips="0"'
        out.append(f'<Piece NumberOfPoints="{len(pts)}" {count}="{b - a}"{extra}>\n<CellData>\n')
        for name, v in mesh.cell_data.items():
            v = np.asarray(v[a:b])
            out.append(_array(v, name, 1 if v.ndim == 1 else v.shape[1]))
        out.append("</CellData>\n<Points>\n" + _array(pts, comps=3) + "</Points>\n")
        tag = "Cells" if volume else "Polys"
        out.append(f"<{tag}>\n" + _array(conn, "connectivity") + _array(ends, "offsets"))
        if volume:
            sizes = np.diff(np.concatenate([[0], ends]))
            types = np.array([_CELL_TYPE.get(int(s), 7) for s in sizes], dtype=np.uint8)
            out.append(_array(types, "types"))
        out.append(f"</{tag}>\n</Piece>\n")
    out.append(f"</{kind}>\n</VTKFile>\n")
    path.write_text("".join(out))
