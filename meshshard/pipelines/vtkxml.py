"""A fast reader for the cells and cell arrays of VTK XML meshes (``.vtp``, ``.vtu``).

``pyvista.read`` (VTK's XML readers) decodes every array of a file in one thread and builds VTK
objects around them. Preprocessing needs the points, the cell connectivity and a few named
cell arrays, so this reader memory-maps the file, walks its XML tags without parsing the data
between them, and decodes only those arrays: base64 with ``binascii``, zlib/lzma blocks in a
thread pool (both release the GIL, so blocks of one array decompress while the next array's
base64 is decoded), and raw appended data as zero-copy views of the mapping.

What it reads: one ``<Piece>`` of ``PolyData`` (its polygons) or ``UnstructuredGrid`` (cells
without polyhedron face streams); inline ``binary`` or ``appended`` (raw or base64) data; no
compression, ``vtkZLibDataCompressor`` or ``vtkLZMADataCompressor``; UInt32 or UInt64 headers;
either byte order. Anything else -- ASCII data, LZ4, several pieces, polyhedra, or a file whose
sizes do not add up -- raises :class:`UnsupportedVtkXml`, and the caller reads the file with VTK
instead (which also gives VTK's own verdict on a damaged file). Every decoded array is checked
against the counts in the XML (points, cells, connectivity length, offsets monotone and ending
at the connectivity length, vertex ids in range), so a file that passes is internally
consistent.
"""

from __future__ import annotations

import binascii
import lzma
import mmap
import os
import re
import zlib
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import unescape

import numpy as np

__all__ = ["CellMesh", "UnsupportedVtkXml", "read_cells"]


class UnsupportedVtkXml(Exception):
    """The file uses a feature this reader does not decode (or does not add up); read it with
    VTK instead."""


@dataclass
class CellMesh:
    """Points, cells and the requested cell arrays of one mesh.

    Attributes
    ----------
    points : ndarray of shape (n_points, 3)
        In the file's precision.
    offsets : ndarray of shape (n_cells + 1,)
        Cell ``i`` has vertices ``connectivity[offsets[i]:offsets[i + 1]]``.
    connectivity : ndarray
    cell_data : dict[str, ndarray]
        The requested arrays found in the file, shape (n_cells,) or (n_cells, components).
    cell_array_names : list[str]
        Every cell array of the file (requested or not).
    n_other_cells : int
        PolyData only: vertices, lines and strips (not in ``offsets``; a boundary file has none).
    """

    points: np.ndarray
    offsets: np.ndarray
    connectivity: np.ndarray
    cell_data: dict[str, np.ndarray]
    cell_array_names: list[str]
    n_other_cells: int = 0

    @property
    def n_cells(self) -> int:
        """Cells in ``offsets`` plus the PolyData cells that are not polygons."""
        return self.offsets.size - 1 + self.n_other_cells


_TYPES = {
    "Int8": "i1",
    "UInt8": "u1",
    "Int16": "i2",
    "UInt16": "u2",
    "Int32": "i4",
    "UInt32": "u4",
    "Int64": "i8",
    "UInt64": "u8",
    "Float32": "f4",
    "Float64": "f8",
}
_DECOMPRESS = {"vtkZLibDataCompressor": zlib.decompress, "vtkLZMADataCompressor": lzma.decompress}
_ATTR = re.compile(rb"""([A-Za-z_:][-\w:.]*)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_NAME = re.compile(rb"\s*([^\s/>]+)")
_WS = b" \t\r\n"
#: output bytes per decompression task (blocks are 32 KiB by VTK's default)
_TASK_BYTES = 4 << 20
#: base64 characters per decoding call (multiple of 4: 3 MiB of bytes)
_B64_CHARS = 4 << 20


@dataclass
class _Array:
    path: tuple[str, ...]
    attrs: dict[str, str]
    start: int = -1  # inline: first byte after the opening tag
    end: int = -1  # inline: the next '<'


@dataclass
class _Layout:
    root: dict[str, str]
    kind: str
    pieces: list[dict[str, str]] = field(default_factory=list)
    arrays: list[_Array] = field(default_factory=list)
    appended: tuple[str, int] | None = None  # (encoding, offset of the byte after '_')


def _scan(mm: mmap.mmap) -> _Layout:
    """Tags of the XML part of the file; stops at <AppendedData> (binary from there on)."""
    pos = 0
    stack: list[str] = []
    layout: _Layout | None = None
    pending: _Array | None = None  # inline DataArray whose text runs to the next '<'
    while True:
        lt = mm.find(b"<", pos)
        if lt < 0:
            break
        if pending is not None:
            pending.end = lt
            pending = None
        if mm[lt + 1 : lt + 4] == b"!--":
            end = mm.find(b"-->", lt + 4)
            if end < 0:
                raise UnsupportedVtkXml("unterminated comment")
            pos = end + 3
            continue
        gt = mm.find(b">", lt)
        if gt < 0:
            raise UnsupportedVtkXml("unterminated tag")
        tag = mm[lt + 1 : gt]
        pos = gt + 1
        if tag[:1] in (b"?", b"!"):
            continue
        if tag[:1] == b"/":
            name = tag[1:].strip().decode("latin-1")
            if not stack or stack[-1] != name:
                raise UnsupportedVtkXml(f"</{name}> does not close <{stack[-1] if stack else ''}>")
            stack.pop()
            continue
        closed = tag.endswith(b"/")
        m = _NAME.match(tag)
        if m is None:
            raise UnsupportedVtkXml("empty tag")
        name = m.group(1).decode("latin-1")
        attrs = {
            k.decode("latin-1"): unescape((a or b).decode("utf-8", "replace"))
            for k, a, b in _ATTR.findall(tag, m.end())
        }
        if layout is None:
            if name != "VTKFile":
                raise UnsupportedVtkXml(f"first element is <{name}>, not <VTKFile>")
            layout = _Layout(root=attrs, kind=attrs.get("type", ""))
        elif name == "Piece":
            layout.pieces.append(attrs)
        elif name == "DataArray":
            arr = _Array(tuple(stack), attrs, start=pos, end=pos)
            layout.arrays.append(arr)
            pending = None if closed else arr
        elif name == "AppendedData":
            us = mm.find(b"_", pos)
            if us < 0:
                raise UnsupportedVtkXml("<AppendedData> without its '_' marker")
            layout.appended = (attrs.get("encoding", "raw"), us + 1)
            break
        if not closed:
            stack.append(name)
    if layout is None:
        raise UnsupportedVtkXml("no <VTKFile> element")
    return layout


class _Decoder:
    """Decodes DataArrays of one mapped file; decompression runs on ``pool``."""

    def __init__(self, mm: mmap.mmap, layout: _Layout, pool: ThreadPoolExecutor | None) -> None:
        root = layout.root
        self.mm = mm
        self.view = memoryview(mm)
        order = root.get("byte_order", "LittleEndian")
        if order not in ("LittleEndian", "BigEndian"):
            raise UnsupportedVtkXml(f"byte_order={order!r}")
        self.bo = "<" if order == "LittleEndian" else ">"
        header = root.get("header_type", "UInt32")
        if header not in ("UInt32", "UInt64"):
            raise UnsupportedVtkXml(f"header_type={header!r}")
        self.hdt = np.dtype(self.bo + _TYPES[header])
        comp = root.get("compressor")
        if comp is not None and comp not in _DECOMPRESS:
            raise UnsupportedVtkXml(f"compressor {comp!r}")
        self.decompress = _DECOMPRESS.get(comp) if comp else None
        self.appended = layout.appended
        self.pool = pool
        self.futures: list[Future] = []
        self.next_block = 0

    # --- helpers -------------------------------------------------------------------------
    def _ints(self, raw: bytes | memoryview, n: int) -> np.ndarray:
        if len(raw) < n * self.hdt.itemsize:
            raise UnsupportedVtkXml("truncated array header")
        return np.frombuffer(raw, self.hdt, n).astype(np.int64)

    def _b64(self, start: int, nbytes: int) -> tuple[bytes, int]:
        """Decode the ``nbytes`` that base64 text at ``start`` encodes; returns (bytes, end)."""
        nchars = -(-nbytes // 3) * 4
        end = start + nchars
        if end > len(self.mm):
            raise UnsupportedVtkXml("base64 data runs past the end of the file")
        try:
            out = binascii.a2b_base64(self.view[start:end])
        except binascii.Error as exc:
            raise UnsupportedVtkXml(f"bad base64: {exc}") from None
        if len(out) < nbytes:
            raise UnsupportedVtkXml("short base64 data (whitespace inside, or truncated)")
        return out, end

    def _blocks(self, hdr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Compressed and uncompressed offsets of the blocks a compression header lists."""
        nblocks, bsize, last = (int(v) for v in hdr[:3])
        csize = hdr[3 : 3 + nblocks]
        usize = np.full(nblocks, bsize, dtype=np.int64)
        if nblocks and last:
            usize[-1] = last
        return np.concatenate(([0], np.cumsum(csize))), np.concatenate(([0], np.cumsum(usize)))

    def _inflate(
        self, data, cofs: np.ndarray, uofs: np.ndarray, out: np.ndarray, ready: int | None = None
    ) -> int:
        """Queue the blocks whose compressed bytes lie below ``ready`` (default: all of them)
        for decompression into ``out`` (uint8), from block ``self.next_block`` on; returns the
        next block not queued. Errors surface in ``finish``."""
        dec = self.decompress
        n = cofs.size - 1
        cofs_l, uofs_l = cofs.tolist(), uofs.tolist()

        def task(b0: int, b1: int) -> None:
            for b in range(b0, b1):
                u0, u1 = uofs_l[b], uofs_l[b + 1]
                try:
                    got = dec(data[cofs_l[b] : cofs_l[b + 1]])
                except (zlib.error, lzma.LZMAError) as exc:
                    raise UnsupportedVtkXml(f"block {b} does not decompress: {exc}") from None
                if len(got) != u1 - u0:
                    raise UnsupportedVtkXml(f"block {b} is {len(got)} bytes, header says {u1 - u0}")
                out[u0:u1] = np.frombuffer(got, np.uint8)

        per = max(1, _TASK_BYTES // max(1, uofs_l[1] - uofs_l[0] if n else 1))
        b0 = self.next_block
        while b0 < n:
            b1 = min(n, b0 + per)
            if ready is not None and cofs_l[b1] > ready:
                # not all decoded yet: queue the complete blocks only in whole tasks
                break
            if self.pool is None:
                task(b0, b1)
            else:
                self.futures.append(self.pool.submit(task, b0, b1))
            b0 = b1
        self.next_block = b0
        return b0

    def _b64_blocks(self, start: int, cofs: np.ndarray, uofs: np.ndarray, out: np.ndarray) -> None:
        """Decode base64-encoded compressed blocks piece by piece, queueing each block's
        decompression as soon as its bytes are decoded (the GIL-bound base64 decoding overlaps
        the decompression, and no call holds the GIL for long)."""
        total = int(cofs[-1])
        nchars = -(-total // 3) * 4
        if start + nchars > len(self.mm):
            raise UnsupportedVtkXml("base64 data runs past the end of the file")
        buf = np.empty(total + 2, dtype=np.uint8)  # a last quantum may decode 2 bytes too many
        step = _B64_CHARS
        done = 0
        self.next_block = 0
        for c0 in range(0, nchars, step):
            c1 = min(nchars, c0 + step)
            try:
                piece = binascii.a2b_base64(self.view[start + c0 : start + c1])
            except binascii.Error as exc:
                raise UnsupportedVtkXml(f"bad base64: {exc}") from None
            expect = min(total, (c1 // 4) * 3) - done
            if len(piece) < expect:
                raise UnsupportedVtkXml("short base64 data (whitespace inside, or truncated)")
            buf[done : done + expect] = np.frombuffer(piece, np.uint8, expect)
            done += expect
            self._inflate(buf, cofs, uofs, out, ready=done if done < total else None)

    # --- one array -----------------------------------------------------------------------
    @staticmethod
    def _count(size: int, dt: np.dtype, count: int, what: str) -> int:
        """``count``, after checking that the header's ``size`` in bytes agrees."""
        if size != count * dt.itemsize:
            raise UnsupportedVtkXml(f"{what}: {size} bytes, expected {count * dt.itemsize}")
        return count

    def array(self, arr: _Array, count: int, what: str) -> np.ndarray:
        """The ``count`` values of ``arr`` (1-D; an error unless its header says as many).

        Compressed arrays are filled by the pool: call ``finish`` before reading them."""
        a = arr.attrs
        typ = a.get("type")
        if typ not in _TYPES:
            raise UnsupportedVtkXml(f"{what}: type {typ!r}")
        dt = np.dtype(self.bo + _TYPES[typ])
        fmt = a.get("format", "ascii")
        hs = self.hdt.itemsize
        if fmt == "appended":
            if self.appended is None:
                raise UnsupportedVtkXml(f"{what}: appended array without <AppendedData>")
            encoding, base = self.appended
            try:
                start = base + int(a["offset"])
            except (KeyError, ValueError):
                raise UnsupportedVtkXml(f"{what}: appended array without an offset") from None
            if encoding == "raw":
                return self._raw(start, dt, count, what)
            if encoding != "base64":
                raise UnsupportedVtkXml(f"{what}: appended encoding {encoding!r}")
        elif fmt == "binary":
            start, end = arr.start, arr.end
            while start < end and self.mm[start] in _WS:
                start += 1
        else:
            raise UnsupportedVtkXml(f"{what}: format {fmt!r}")
        if self.decompress is None:
            # one base64 stream of header + data, or the header encoded on its own (then the
            # header's characters end in '=' padding, which only happens when hs % 3 != 0)
            hchars = -(-hs // 3) * 4
            head, _ = self._b64(start, hs)
            n = self._count(int(self._ints(head, 1)[0]), dt, count, what)
            if hs % 3 and self.mm[start + hchars - 1] == ord("="):
                data, _ = self._b64(start + hchars, n * dt.itemsize)
                return np.frombuffer(data, dt, n)
            data, _ = self._b64(start, hs + n * dt.itemsize)
            return np.frombuffer(data, dt, n, offset=hs)
        # compressed: the header [nblocks, blocksize, lastsize, csize...] is its own stream
        first, _ = self._b64(start, 3 * hs)
        nblocks = int(self._ints(first, 1)[0])
        head, dstart = self._b64(start, (3 + nblocks) * hs)
        cofs, uofs = self._blocks(self._ints(head, 3 + nblocks))
        n = self._count(int(uofs[-1]), dt, count, what)
        out = np.empty(n * dt.itemsize, dtype=np.uint8)
        self._b64_blocks(dstart, cofs, uofs, out)
        return out.view(dt)

    def _raw(self, start: int, dt: np.dtype, count: int, what: str) -> np.ndarray:
        hs = self.hdt.itemsize
        first = int(self._ints(self.view[start : start + hs], 1)[0])
        if self.decompress is None:
            n = self._count(first, dt, count, what)
            if start + hs + n * dt.itemsize > len(self.mm):
                raise UnsupportedVtkXml(f"{what}: runs past the end of the file")
            return np.frombuffer(self.mm, dt, n, offset=start + hs)  # zero-copy view
        hend = start + (3 + first) * hs
        cofs, uofs = self._blocks(self._ints(self.view[start:hend], 3 + first))
        n = self._count(int(uofs[-1]), dt, count, what)
        if hend + int(cofs[-1]) > len(self.mm):
            raise UnsupportedVtkXml(f"{what}: runs past the end of the file")
        out = np.empty(n * dt.itemsize, dtype=np.uint8)
        self.next_block = 0
        self._inflate(self.view[hend : hend + int(cofs[-1])], cofs, uofs, out)
        return out.view(dt)

    def finish(self) -> None:
        """Wait for every decompression task; re-raise the first failure."""
        err = None
        for f in self.futures:
            exc = f.exception()
            if exc is not None and err is None:
                err = exc
        self.futures.clear()
        if err is not None:
            raise err


def _int_attr(attrs: dict[str, str], key: str, default: int | None = None) -> int:
    try:
        v = int(attrs[key]) if default is None else int(attrs.get(key, default))
    except (KeyError, ValueError):
        raise UnsupportedVtkXml(f"<Piece> lacks a valid {key}") from None
    if v < 0:
        raise UnsupportedVtkXml(f"{key}={v}")
    return v


def _pick(arrays: Iterable[_Array], parent: str, name: str | None = None) -> list[_Array]:
    return [
        a
        for a in arrays
        if a.path[-1:] == (parent,) and (name is None or a.attrs.get("Name") == name)
    ]


def _native(a: np.ndarray) -> np.ndarray:
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def read_cells(
    path: str | Path, names: Iterable[str], *, threads: int | None = None
) -> CellMesh:
    """Points, cells and the cell arrays ``names`` (those present) of a VTK XML mesh.

    Parameters
    ----------
    path : path
        A ``.vtp`` (polygons are read) or ``.vtu`` file.
    names : iterable of str
        Cell arrays to decode; absent names are simply not in ``cell_data``.
    threads : int, optional
        Decompression threads (default: the CPUs this process may use, at most 8).

    Raises
    ------
    UnsupportedVtkXml
        A feature this reader does not decode, or sizes that do not add up: read with VTK.
    OSError
        The file cannot be opened.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise UnsupportedVtkXml("empty file")
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    if threads is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = min(8, cpus or 1)
    pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None
    try:
        return _read(mm, list(names), pool)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _read(mm: mmap.mmap, names: list[str], pool: ThreadPoolExecutor | None) -> CellMesh:
    layout = _scan(mm)
    kind = layout.kind
    if kind not in ("PolyData", "UnstructuredGrid"):
        raise UnsupportedVtkXml(f"dataset type {kind!r}")
    if len(layout.pieces) != 1:
        raise UnsupportedVtkXml(f"{len(layout.pieces)} pieces")
    piece = layout.pieces[0]
    n_points = _int_attr(piece, "NumberOfPoints")
    arrays = [a for a in layout.arrays if a.path[:3] == ("VTKFile", kind, "Piece")]
    if kind == "PolyData":
        n_polys = _int_attr(piece, "NumberOfPolys", 0)
        n_other = sum(_int_attr(piece, k, 0) for k in ("NumberOfVerts", "NumberOfLines"))
        n_other += _int_attr(piece, "NumberOfStrips", 0)
        cells_tag, n_main = "Polys", n_polys
    else:
        n_other = 0
        n_main = _int_attr(piece, "NumberOfCells")
        cells_tag = "Cells"
        if _pick(arrays, "Cells", "faces") or _pick(arrays, "Cells", "polyhedron_to_faces"):
            raise UnsupportedVtkXml("polyhedron cells")
    n_cells = n_main + n_other
    dec = _Decoder(mm, layout, pool)

    pts = _pick(arrays, "Points")
    if len(pts) != 1:
        raise UnsupportedVtkXml(f"{len(pts)} point arrays")
    if int(pts[0].attrs.get("NumberOfComponents", 1)) != 3:
        raise UnsupportedVtkXml("points without 3 components")
    points = dec.array(pts[0], 3 * n_points, "points").reshape(n_points, 3)

    off_a = _pick(arrays, cells_tag, "offsets")
    con_a = _pick(arrays, cells_tag, "connectivity")
    if n_main and (len(off_a) != 1 or len(con_a) != 1):
        raise UnsupportedVtkXml(f"<{cells_tag}> without one offsets and one connectivity array")
    first = len(dec.futures)
    offsets = dec.array(off_a[0], n_main, "offsets") if n_main else np.zeros(0, np.int64)
    mine = dec.futures[first:]

    found = [a.attrs.get("Name", "") for a in _pick(arrays, "CellData")]
    cell_data = {}
    for name in names:
        hits = _pick(arrays, "CellData", name)
        if not hits:
            continue
        comps = int(hits[0].attrs.get("NumberOfComponents", 1))
        if comps < 1:
            raise UnsupportedVtkXml(f"cell array {name!r}: NumberOfComponents={comps}")
        a = dec.array(hits[0], comps * n_cells, f"cell array {name!r}")
        cell_data[name] = a.reshape(n_cells, comps) if comps > 1 else a
    # the connectivity's length is the last offset: a damaged header can then not make it
    # allocate an absurd buffer (the offsets decompress while the fields' base64 is decoded)
    for f in mine:
        f.result()
    offsets = _native(offsets)
    if n_main and (offsets[0] < 0 or np.any(offsets[1:] < offsets[:-1])):
        raise UnsupportedVtkXml("offsets not increasing")
    n_conn = int(offsets[-1]) if n_main else 0
    conn = dec.array(con_a[0], n_conn, "connectivity") if n_main else np.zeros(0, np.int64)
    dec.finish()
    points, conn = _native(points), _native(conn)
    cell_data = {k: _native(v) for k, v in cell_data.items()}
    full = np.empty(n_main + 1, dtype=np.int64)
    full[0] = 0
    full[1:] = offsets
    if conn.size and (int(conn.min()) < 0 or int(conn.max()) >= n_points):
        raise UnsupportedVtkXml("connectivity refers to points that do not exist")
    return CellMesh(
        points=points,
        offsets=full,
        connectivity=conn,
        cell_data=cell_data,
        cell_array_names=found,
        n_other_cells=n_other,
    )
