"""A fast reader for the cells and cell arrays of VTK XML meshes (``.vtp``, ``.vtu``).

``pyvista.read`` (VTK's XML readers) decodes every array of a file in one thread and builds VTK
objects around them. Preprocessing needs the points, the cell connectivity and a few named
cell arrays, so this reader memory-maps the file, walks its XML tags without parsing the data
between them, and decodes only those arrays: base64 with ``binascii``, zlib/LZ4/lzma blocks in a
thread pool (both release the GIL, so blocks of one array decompress while the next array's
base64 is decoded), and raw appended data as zero-copy views of the mapping.
:meth:`VtkXmlFile.pieces` streams one array in consecutive pieces (a few decoded ahead on the
pool), so a volume's centres and fields are computed without its whole connectivity or
fields in memory.

What it reads: one ``<Piece>`` (or, with ``piece=``, any one of several) of ``PolyData``
(its polygons) or ``UnstructuredGrid`` (any cells; of polyhedra their point lists, and their
faces on request, :meth:`VtkXmlFile.polyhedra`); inline ``binary`` or ``appended`` (raw or
base64) data; no compression,
``vtkZLibDataCompressor``, ``vtkLZ4DataCompressor`` (with the ``lz4`` package) or
``vtkLZMADataCompressor``; UInt32 or UInt64 headers; either byte
order. Anything else -- ASCII data, several pieces with none chosen, another dataset type
-- raises :class:`UnsupportedVtkXml`,
and the caller may read the file with VTK instead. A *damaged* file raises
:class:`CorruptVtkXml` (an :class:`~meshshard.io.errors.InputFileError` naming the file)
and must never be handed to VTK, whose readers crash or allocate without bound on such files:
malformed or truncated XML, negative or absurd counts, offsets or block headers, sizes that do
not add up, blocks that do not decompress to their declared size, connectivity out of range.
Every size is checked against the file before a buffer is allocated: uncompressed data must lie
in the file, and a compressed block may not claim more than its compressor can produce from its
bytes (1032:1 for zlib, 256:1 for LZ4). Blocks are inflated with their output bounded by their
declared size, so a decompression bomb fails after producing at most that. Every decoded array
is checked against the counts in the XML (points, cells, connectivity length, offsets monotone
and ending at the connectivity length, vertex ids in range), so a file that passes is
internally consistent.

Length (~980 lines): one decoder; the scanner, the block decoder and :class:`VtkXmlFile` share
the private layout records and bounds checks, and splitting them would spread one file
format's rules over several modules.
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import unescape

import numpy as np

from meshshard.errors import InputError
from meshshard.io.cells import VTK_POLYHEDRON, PolyhedronFaces
from meshshard.io.errors import InputFileError

__all__ = [
    "CellMesh", "CorruptVtkXml", "SeveralPieces", "UnsupportedVtkXml", "VtkXmlFile", "read_cells",
]  # fmt: skip


class UnsupportedVtkXml(InputError):
    """The file is well formed but uses a feature this reader does not decode (ASCII data,
    several pieces, another dataset type); VTK may read it instead."""


class SeveralPieces(UnsupportedVtkXml):
    """The file holds several ``<Piece>`` elements and none was chosen (read them with
    :func:`meshshard.io.vtkguard.read_all_pieces`)."""


class CorruptVtkXml(InputFileError):
    """The file is damaged (never hand it to VTK); the message names the file and what is
    wrong."""

    def __init__(self, detail: str, path: str | Path | None = None) -> None:
        self.detail = detail
        msg = detail
        if path is not None:
            msg = f"{path}: truncated or corrupt VTK XML file ({detail}); re-export it"
        super().__init__(msg, path)


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
_DECOMPRESS = {
    "vtkZLibDataCompressor": "zlib",
    "vtkLZMADataCompressor": "lzma",
    "vtkLZ4DataCompressor": "lz4",
}
#: the most output a compressed block may claim per compressed byte (deflate's limit is 1032;
#: LZ4's is 255; xz reaches ~7000 on long runs of zeros), plus a constant for headers
_RATIO = {"zlib": 1032, "lz4": 256, "lzma": 1 << 16}
_RATIO_SLACK = 1024
#: VTK types this reader does not decode (VTK may read them); any other unknown type is damage
_OTHER_TYPES = ("String", "Char", "Bit", "IdType")
_OTHER_COMPRESSORS: tuple[str, ...] = ()
_OTHER_KINDS = (
    "ImageData", "RectilinearGrid", "StructuredGrid", "HyperTreeGrid", "Table",
    "PPolyData", "PUnstructuredGrid", "PImageData", "PRectilinearGrid", "PStructuredGrid",
)  # fmt: skip
#: deepest element nesting of a VTK XML mesh (VTKFile/type/Piece/CellData/DataArray/...)
_MAX_DEPTH = 16
_ATTR = re.compile(rb"""([A-Za-z_:][-\w:.]*)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_NAME = re.compile(rb"\s*([^\s/>]+)")
_WS = b" \t\r\n"
_ENTITIES = {"&quot;": '"', "&apos;": "'"}
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
    piece: int = -1  # index of the <Piece> it belongs to


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
                raise CorruptVtkXml("unterminated comment")
            pos = end + 3
            continue
        gt = mm.find(b">", lt)
        if gt < 0:
            raise CorruptVtkXml("unterminated tag")
        tag = mm[lt + 1 : gt]
        pos = gt + 1
        if tag[:1] in (b"?", b"!"):
            continue
        if tag[:1] == b"/":
            name = tag[1:].strip().decode("latin-1")
            if not stack or stack[-1] != name:
                raise CorruptVtkXml(f"</{name}> does not close <{stack[-1] if stack else ''}>")
            stack.pop()
            continue
        closed = tag.endswith(b"/")
        m = _NAME.match(tag)
        if m is None:
            raise CorruptVtkXml("empty tag")
        name = m.group(1).decode("latin-1")
        attrs = {
            k.decode("latin-1"): unescape((a or b).decode("utf-8", "replace"), _ENTITIES)
            for k, a, b in _ATTR.findall(tag, m.end())
        }
        if layout is None:
            if name != "VTKFile":
                raise CorruptVtkXml(f"first element is <{name}>, not <VTKFile>")
            layout = _Layout(root=attrs, kind=attrs.get("type", ""))
        elif name == "Piece":
            layout.pieces.append(attrs)
        elif name == "DataArray":
            arr = _Array(tuple(stack), attrs, start=pos, end=pos, piece=len(layout.pieces) - 1)
            layout.arrays.append(arr)
            pending = None if closed else arr
        elif name == "AppendedData":
            us = mm.find(b"_", pos)
            if us < 0:
                raise CorruptVtkXml("<AppendedData> without its '_' marker")
            layout.appended = (attrs.get("encoding", "raw"), us + 1)
            break
        if not closed:
            stack.append(name)
            if len(stack) > _MAX_DEPTH:
                raise CorruptVtkXml(f"elements nested deeper than {_MAX_DEPTH}")
    if layout is None:
        raise CorruptVtkXml("no <VTKFile> element")
    if stack and layout.appended is None:
        raise CorruptVtkXml(f"the file ends inside <{stack[-1]}> (truncated)")
    return layout


@dataclass
class _Blocks:
    """Where a compressed array's blocks are: byte offsets of each block in the compressed
    stream (``cofs``) and in the decoded array (``uofs``), as lists (indexed per block on the
    decoding path); the stream starts at ``start`` (a byte of the file for raw data, a base64
    character for base64 data)."""

    cofs: list[int]
    uofs: list[int]
    start: int
    base64: bool


class _Decoder:
    """Decodes DataArrays of one mapped file; decompression runs on ``pool``."""

    def __init__(
        self, mm: mmap.mmap, layout: _Layout, pool: ThreadPoolExecutor | None, threads: int
    ) -> None:
        root = layout.root
        self.mm = mm
        self.view = memoryview(mm)
        self.address = np.frombuffer(mm, np.uint8, 0).__array_interface__["data"][0]
        order = root.get("byte_order", "LittleEndian")
        if order not in ("LittleEndian", "BigEndian"):
            raise CorruptVtkXml(f"byte_order={order!r} is not a VTK byte order")
        self.bo = "<" if order == "LittleEndian" else ">"
        header = root.get("header_type", "UInt32")
        if header not in ("UInt32", "UInt64"):
            raise CorruptVtkXml(f"header_type={header!r} is not a VTK header type")
        self.hdt = np.dtype(self.bo + _TYPES[header])
        comp = root.get("compressor")
        if comp in _OTHER_COMPRESSORS:
            raise UnsupportedVtkXml(f"compressor {comp!r}")
        if comp is not None and comp not in _DECOMPRESS:
            raise CorruptVtkXml(f"compressor={comp!r} is not a VTK compressor")
        self.decompress = _DECOMPRESS.get(comp) if comp else None
        if self.decompress == "lz4":
            try:
                import lz4.block  # noqa: F401
            except ImportError:  # lz4 is a dependency; without it VTK reads the file
                raise UnsupportedVtkXml("LZ4 data without the lz4 package") from None
        self.size = len(mm)
        self.appended = layout.appended
        self.pool = pool
        self.threads = threads
        self.futures: list[Future] = []

    # --- helpers -------------------------------------------------------------------------
    def _ints(self, raw: bytes | memoryview, n: int) -> list[int]:
        """``n`` header words as Python ints (unsigned: a UInt64 never wraps negative)."""
        if len(raw) < n * self.hdt.itemsize:
            raise CorruptVtkXml("truncated array header")
        return np.frombuffer(raw, self.hdt, n).tolist()

    def _b64(self, start: int, nbytes: int) -> tuple[bytes, int]:
        """Decode the ``nbytes`` that base64 text at ``start`` encodes; returns (bytes, end)."""
        nchars = -(-nbytes // 3) * 4
        end = start + nchars
        if end > len(self.mm):
            raise CorruptVtkXml("base64 data runs past the end of the file")
        try:
            out = binascii.a2b_base64(self.view[start:end])
        except binascii.Error as exc:
            raise CorruptVtkXml(f"bad base64: {exc}") from None
        if len(out) < nbytes:
            raise CorruptVtkXml("short base64 data (whitespace inside, or truncated)")
        return out, end

    def _dtype(self, arr: _Array, what: str) -> np.dtype:
        typ = arr.attrs.get("type")
        if typ in _OTHER_TYPES:
            raise UnsupportedVtkXml(f"{what}: type {typ!r}")
        if typ not in _TYPES:
            raise CorruptVtkXml(f"{what}: type={typ!r} is not a VTK data type")
        return np.dtype(self.bo + _TYPES[typ])

    def _locate(self, arr: _Array, what: str) -> tuple[int, bool]:
        """First byte (raw) or character (base64) of the array's header, and whether base64."""
        a = arr.attrs
        fmt = a.get("format", "ascii")
        if fmt == "appended":
            if self.appended is None:
                raise CorruptVtkXml(f"{what}: appended array without <AppendedData>")
            encoding, base = self.appended
            try:
                offset = int(a["offset"])
            except (KeyError, ValueError):
                raise CorruptVtkXml(f"{what}: appended array without a valid offset") from None
            if not 0 <= offset < self.size - base:
                raise CorruptVtkXml(f"{what}: offset={offset} outside the appended data")
            if encoding not in ("raw", "base64"):
                raise CorruptVtkXml(f"{what}: appended encoding={encoding!r} is not raw/base64")
            return base + offset, encoding == "base64"
        if fmt == "binary":
            start, end = arr.start, arr.end
            while start < end and self.mm[start] in _WS:
                start += 1
            return start, True
        if fmt == "ascii":
            raise UnsupportedVtkXml(f"{what}: format {fmt!r}")
        raise CorruptVtkXml(f"{what}: format={fmt!r} is not ascii, binary or appended")

    @staticmethod
    def _check_size(size: int, dt: np.dtype, count: int, what: str) -> None:
        if size != count * dt.itemsize:
            raise CorruptVtkXml(
                f"{what}: {size} bytes, expected {count * dt.itemsize} ({count} values of "
                f"{dt.itemsize} bytes, from the counts in the XML)"
            )

    def _blocks(self, start: int, base64: bool, nbytes: int, what: str) -> _Blocks:
        """The block table of a compressed array (header [nblocks, blocksize, lastsize,
        csize...], base64-encoded on its own in base64 data)."""
        hs = self.hdt.itemsize
        if base64:
            first, _ = self._b64(start, 3 * hs)
            nblocks = self._ints(first, 1)[0]
        else:
            nblocks = self._ints(self.view[start : start + hs], 1)[0]
        # every block has a header word and at least one compressed byte in the file
        if nblocks > (self.size - start) // (hs + 1):
            raise CorruptVtkXml(f"{what}: header claims {nblocks} blocks, more than the file holds")
        if base64:
            head, dstart = self._b64(start, (3 + nblocks) * hs)
            hdr = self._ints(head, 3 + nblocks)
        else:
            dstart = start + (3 + nblocks) * hs
            hdr = self._ints(self.view[start:dstart], 3 + nblocks)
        _, bsize, last = hdr[:3]
        csize = hdr[3:]
        if nblocks and not (0 < bsize and 0 <= last <= bsize):
            raise CorruptVtkXml(f"{what}: block size {bsize}, last block {last}")
        total = (nblocks - 1) * bsize + (last or bsize) if nblocks else 0
        self._check_size(total, np.dtype(np.uint8), nbytes, what)
        csum = sum(csize)
        end = dstart + (-(-csum // 3) * 4 if base64 else csum)
        if end > self.size:
            raise CorruptVtkXml(f"{what}: runs past the end of the file")
        ratio = _RATIO[self.decompress]
        usize = [bsize] * nblocks
        if nblocks and last:
            usize[-1] = last
        if nblocks and min(c * ratio + _RATIO_SLACK - u for c, u in zip(csize, usize)) < 0:
            raise CorruptVtkXml(
                f"{what}: a block claims more bytes than {self.decompress} can produce from it"
            )
        cofs = np.concatenate(([0], np.cumsum(csize, dtype=np.int64))).tolist()
        uofs = np.concatenate(([0], np.cumsum(usize, dtype=np.int64))).tolist()
        return _Blocks(cofs, uofs, dstart, base64)

    def _compressed(self, blk: _Blocks, b0: int, b1: int):
        """The compressed bytes of blocks ``b0:b1`` (base64 decoded just for them)."""
        c0, c1 = blk.cofs[b0], blk.cofs[b1]
        if not blk.base64:
            return self.view[blk.start + c0 : blk.start + c1]
        q0, q1 = c0 // 3, -(-c1 // 3)
        text = self.view[blk.start + 4 * q0 : blk.start + 4 * q1]
        try:
            raw = binascii.a2b_base64(text)
        except binascii.Error as exc:
            raise CorruptVtkXml(f"bad base64: {exc}") from None
        self._release(np.frombuffer(text, np.uint8))
        if len(raw) < c1 - 3 * q0:
            raise CorruptVtkXml("short base64 data (whitespace inside, or truncated)")
        return memoryview(raw)[c0 - 3 * q0 : c1 - 3 * q0]

    def _inflate_into(self, data, blk: _Blocks, b0: int, b1: int, out: np.ndarray) -> None:
        """Decompress blocks ``b0:b1`` (compressed bytes ``data``, which start at block b0's)
        into ``out`` (uint8, starting at block b0's first byte)."""
        cofs, uofs = blk.cofs, blk.uofs
        c_base, u_base = cofs[b0], uofs[b0]
        for b in range(b0, b1):
            c0, c1 = cofs[b] - c_base, cofs[b + 1] - c_base
            u0, u1 = uofs[b] - u_base, uofs[b + 1] - u_base
            got = _inflate(self.decompress, data[c0:c1], u1 - u0, b)
            out[u0:u1] = np.frombuffer(got, np.uint8)

    def _per_task(self, blk: _Blocks, nbytes: int) -> int:
        """Blocks per task for tasks of about ``nbytes`` decoded bytes."""
        first = blk.uofs[1] - blk.uofs[0] if len(blk.uofs) > 1 else 1
        return max(1, nbytes // max(1, first))

    def _queue(self, fn, *args) -> None:
        if self.pool is None:
            fn(*args)
        else:
            self.futures.append(self.pool.submit(fn, *args))

    # --- whole arrays --------------------------------------------------------------------
    def check(self, arr: _Array, count: int, what: str) -> None:
        """Check that ``arr``'s header declares ``count`` values and that its data lies in the
        file (or, compressed, could come from its bytes), without decoding or allocating."""
        dt = self._dtype(arr, what)
        start, base64 = self._locate(arr, what)
        nbytes = count * dt.itemsize
        if self.decompress is not None:
            self._blocks(start, base64, nbytes, what)
            return
        hs = self.hdt.itemsize
        if base64:
            head, _ = self._b64(start, hs)
            end = start + -(-(hs + nbytes) // 3) * 4
        else:
            head = self.view[start : start + hs]
            end = start + hs + nbytes
        self._check_size(self._ints(head, 1)[0], dt, count, what)
        if end > self.size:
            raise CorruptVtkXml(f"{what}: runs past the end of the file")

    def declared(self, arr: _Array, what: str) -> int:
        """Values an encoded (not ASCII) array's header declares, checked against the file
        (the data, or its blocks, lie in it) before anything is allocated."""
        dt = self._dtype(arr, what)
        start, base64 = self._locate(arr, what)
        hs = self.hdt.itemsize
        if self.decompress is not None:
            head = self._b64(start, 3 * hs)[0] if base64 else self.view[start : start + 3 * hs]
            nblocks, bsize, last = self._ints(head, 3)
            nbytes = (nblocks - 1) * bsize + (last or bsize) if nblocks else 0
        else:
            head = self._b64(start, hs)[0] if base64 else self.view[start : start + hs]
            nbytes = self._ints(head, 1)[0]
        if nbytes % dt.itemsize:
            raise CorruptVtkXml(f"{what}: {nbytes} bytes is not a whole number of {dt} values")
        count = nbytes // dt.itemsize
        self.check(arr, count, what)
        return count

    def array(self, arr: _Array, count: int, what: str) -> np.ndarray:
        """The ``count`` values of ``arr`` (1-D; an error unless its header says as many).

        Compressed arrays are filled by the pool: call ``finish`` before reading them, and
        ``_native`` for the byte order."""
        dt = self._dtype(arr, what)
        start, base64 = self._locate(arr, what)
        hs = self.hdt.itemsize
        nbytes = count * dt.itemsize
        if self.decompress is not None:
            blk = self._blocks(start, base64, nbytes, what)
            out = np.empty(nbytes, dtype=np.uint8)
            if base64:
                self._b64_blocks(blk, out)
            else:
                data = self.view[blk.start : blk.start + blk.cofs[-1]]
                per = self._per_task(blk, _TASK_BYTES)
                n = len(blk.cofs) - 1
                for b0 in range(0, n, per):
                    b1 = min(n, b0 + per)
                    sub = data[blk.cofs[b0] : blk.cofs[b1]]
                    dst = out[blk.uofs[b0] : blk.uofs[b1]]
                    self._queue(self._inflate_into, sub, blk, b0, b1, dst)
            return out.view(dt)
        if not base64:
            size = int(self._ints(self.view[start : start + hs], 1)[0])
            self._check_size(size, dt, count, what)
            if start + hs + nbytes > len(self.mm):
                raise CorruptVtkXml(f"{what}: runs past the end of the file")
            return np.frombuffer(self.mm, dt, count, offset=start + hs)  # zero-copy view
        # one base64 stream of header + data, or the header encoded on its own (then the
        # header's characters end in '=' padding, which only happens when hs % 3 != 0)
        hchars = -(-hs // 3) * 4
        head, _ = self._b64(start, hs)
        self._check_size(int(self._ints(head, 1)[0]), dt, count, what)
        if hs % 3 and self.mm[start + hchars - 1] == ord("="):
            data, _ = self._b64(start + hchars, nbytes)
            return np.frombuffer(data, dt, count)
        data, _ = self._b64(start, hs + nbytes)
        return np.frombuffer(data, dt, count, offset=hs)

    def _b64_blocks(self, blk: _Blocks, out: np.ndarray) -> None:
        """Decode base64-encoded compressed blocks piece by piece, queueing blocks for
        decompression as soon as their bytes are decoded (the GIL-bound base64 decoding
        overlaps the decompression, and no call holds the GIL for long)."""
        cofs, uofs = blk.cofs, blk.uofs
        total = cofs[-1]
        nchars = -(-total // 3) * 4
        buf = np.empty(total + 2, dtype=np.uint8)  # a last quantum may decode 2 bytes too many
        n = len(cofs) - 1
        per = self._per_task(blk, _TASK_BYTES)
        done = b0 = 0
        for c0 in range(0, nchars, _B64_CHARS):
            c1 = min(nchars, c0 + _B64_CHARS)
            try:
                piece = binascii.a2b_base64(self.view[blk.start + c0 : blk.start + c1])
            except binascii.Error as exc:
                raise CorruptVtkXml(f"bad base64: {exc}") from None
            expect = min(total, (c1 // 4) * 3) - done
            if len(piece) < expect:
                raise CorruptVtkXml("short base64 data (whitespace inside, or truncated)")
            buf[done : done + expect] = np.frombuffer(piece, np.uint8, expect)
            done += expect
            while b0 < n:  # queue whole tasks whose bytes are all decoded
                b1 = min(n, b0 + per)
                if cofs[b1] > done:
                    break
                dst = out[uofs[b0] : uofs[b1]]
                self._queue(self._inflate_into, buf[cofs[b0] : cofs[b1]], blk, b0, b1, dst)
                b0 = b1

    # --- pieces --------------------------------------------------------------------------
    def pieces(self, arr: _Array, count: int, per: int, unit: int, what: str):
        """Yield ``(first value, values)`` of ``arr`` in consecutive pieces of about ``per``
        values, each a whole number of ``unit`` values (native byte order), decoding a few
        pieces ahead on the pool; only those pieces are held. Raw appended data is yielded
        as views of the mapping, whose pages are released once passed; uncompressed base64
        data (rare for large files) is decoded whole first."""
        dt = self._dtype(arr, what)
        per = max(unit, per // unit * unit)
        start, base64 = self._locate(arr, what)
        nbytes = count * dt.itemsize
        if self.decompress is None:
            whole = self.array(arr, count, what)
            for v0 in range(0, count, per):
                yield v0, _native(whole[v0 : v0 + per])
                if not base64:
                    self._release(whole[v0 : v0 + per])
            return
        blk = self._blocks(start, base64, nbytes, what)
        n = len(blk.cofs) - 1
        step = self._per_task(blk, per * dt.itemsize)

        def task(b0: int, b1: int) -> np.ndarray:
            out = np.empty(blk.uofs[b1] - blk.uofs[b0], dtype=np.uint8)
            data = self._compressed(blk, b0, b1)
            self._inflate_into(data, blk, b0, b1, out)
            if not blk.base64:
                self._release(np.frombuffer(data, np.uint8))
            return out

        ahead = 2 * self.threads
        ubytes = unit * dt.itemsize
        queue: list = []
        starts = iter(range(0, n, step))
        carry = np.zeros(0, dtype=np.uint8)
        done = 0
        while True:
            while len(queue) < ahead:
                b0 = next(starts, None)
                if b0 is None:
                    break
                b1 = min(n, b0 + step)
                queue.append(self.pool.submit(task, b0, b1) if self.pool else task(b0, b1))
            if not queue:
                break
            got = queue.pop(0)
            got = got.result() if isinstance(got, Future) else got
            buf = np.concatenate((carry, got)) if carry.size else got
            whole = buf.size // ubytes * ubytes  # pieces end on whole units (rows)
            carry = buf[whole:]
            if whole:
                yield done, _native(buf[:whole].view(dt))
                done += whole // dt.itemsize
        if carry.size or done != count:
            raise CorruptVtkXml(f"{what}: decoded {done} values, expected {count}")

    def _release(self, view: np.ndarray) -> None:
        """Let the kernel drop the mapped pages under ``view`` (a view of the mapping; read
        again from the page cache if touched later), so a streamed file does not stay
        resident."""
        if not hasattr(self.mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        lo = view.__array_interface__["data"][0] - self.address
        hi = lo + view.nbytes
        first = lo // mmap.PAGESIZE * mmap.PAGESIZE
        if hi > first:
            self.mm.madvise(mmap.MADV_DONTNEED, first, hi - first)

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


def _inflate(kind: str, data, size: int, b: int) -> bytes:
    """Block ``b``'s ``size`` bytes from its compressed ``data``, never producing more than
    ``size + 1`` bytes (a block that inflates past its declared size fails right there)."""
    if kind == "lz4":
        return _inflate_lz4(data, size, b)
    d = zlib.decompressobj() if kind == "zlib" else lzma.LZMADecompressor()
    err = zlib.error if kind == "zlib" else lzma.LZMAError
    try:
        got = d.decompress(data, size + 1)  # (max_length=0 would mean unbounded)
    except err as exc:
        raise CorruptVtkXml(f"block {b} does not decompress: {exc}") from None
    if len(got) > size:
        raise CorruptVtkXml(f"block {b} inflates past the {size} bytes its header declares")
    if not d.eof or len(got) != size:
        raise CorruptVtkXml(f"block {b} is {len(got)} bytes, its header declares {size}")
    return got


def _inflate_lz4(data, size: int, b: int) -> bytes:
    """An LZ4 block (VTK writes raw LZ4 blocks, no frame) into at most ``size`` bytes: LZ4
    fails on output past the buffer, and a shorter output is checked here."""
    import lz4.block

    try:
        got = lz4.block.decompress(bytes(data), uncompressed_size=size) if size else b""
    except lz4.block.LZ4BlockError as exc:
        raise CorruptVtkXml(f"block {b} does not decompress (or inflates past the {size} bytes "
                            f"its header declares): {exc}") from None  # fmt: skip
    if len(got) != size:
        raise CorruptVtkXml(f"block {b} is {len(got)} bytes, its header declares {size}")
    return got


#: decoding threads per file when not given (default: the CPUs this process may use, <= 8)
THREADS_ENV = "MESHSHARD_READ_THREADS"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS says, else the CPU count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads() -> int:
    """``MESHSHARD_READ_THREADS`` when set, else the CPUs this process may use (at most 8)."""
    env = os.environ.get(THREADS_ENV)
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            msg = f"{THREADS_ENV}={env!r} must be an integer"
            raise ValueError(msg) from None
    return min(8, usable_cpus())


def _int_attr(
    attrs: dict[str, str], key: str, default: int | None = None, *, tag: str = "<Piece>"
) -> int:
    try:
        v = int(attrs[key]) if default is None else int(attrs.get(key, default))
    except (KeyError, ValueError):
        raise CorruptVtkXml(f"{tag} lacks a valid {key} (found {attrs.get(key)!r})") from None
    if v < 0:
        raise CorruptVtkXml(f"{tag} {key}={v} is negative")
    return v


def _plausible(count: int, key: str, file_size: int) -> None:
    """A count no file of ``file_size`` bytes can hold (each value takes at least 1/1032 of a
    byte even zlib-compressed; 1/65536 is allowed for any compressor) is damage."""
    if count > (file_size + 1024) * 65536:
        raise CorruptVtkXml(f"{key}={count} cannot fit in a file of {file_size} bytes")


def _pick(arrays: Iterable[_Array], parent: str, name: str | None = None) -> list[_Array]:
    return [
        a
        for a in arrays
        if a.path[-1:] == (parent,) and (name is None or a.attrs.get("Name") == name)
    ]


def _native(a: np.ndarray) -> np.ndarray:
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


class VtkXmlFile:
    """One VTK XML mesh file, opened to decode whole arrays (:meth:`read`) or to stream
    them in pieces (:meth:`pieces`) without holding more than a few pieces.

    ``threads`` decoding threads (default: :func:`default_threads`). Use as a context manager;
    arrays it returned stay valid after :meth:`close`.

    Attributes
    ----------
    kind : str
        ``"PolyData"`` (its polygons are the cells read) or ``"UnstructuredGrid"``.
    n_points, n_cells : int
        ``n_cells`` counts every cell (for PolyData also vertices, lines and strips).
    n_other_cells : int
        PolyData cells that are not polygons.
    cell_array_names : list[str]
    """

    def __init__(
        self, path: str | Path, *, threads: int | None = None, piece: int | None = None
    ) -> None:
        self.path = Path(path)
        self._piece = piece
        self._pool = None
        with open(self.path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                raise CorruptVtkXml("empty file", self.path)
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        if threads is None:
            threads = default_threads()
        self._threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None
        self._offsets: np.ndarray | None = None
        try:
            with self._named():
                self._open()
        except BaseException:
            self.close()
            raise

    @contextmanager
    def _named(self):
        """Errors raised inside name this file (what is wrong, and where)."""
        try:
            yield
        except CorruptVtkXml as exc:
            if exc.path is not None:
                raise
            raise CorruptVtkXml(exc.detail, self.path) from None
        except MemoryError as exc:
            msg = f"{self.path}: out of memory while decoding it ({exc})"
            raise MemoryError(msg) from None

    def _open(self) -> None:
        layout = _scan(self._mm)
        kind = layout.kind
        if kind in _OTHER_KINDS:
            raise UnsupportedVtkXml(f"dataset type {kind!r}")
        if kind not in ("PolyData", "UnstructuredGrid"):
            raise CorruptVtkXml(f"type={kind!r} is not a VTK dataset type")
        if not layout.pieces:
            raise CorruptVtkXml("no <Piece>: the file holds no mesh")
        for piece in layout.pieces:  # counts VTK would allocate by: sane before any hand-off
            for key in ("NumberOfPoints", "NumberOfCells", "NumberOfPolys", "NumberOfVerts",
                        "NumberOfLines", "NumberOfStrips"):  # fmt: skip
                _plausible(_int_attr(piece, key, 0), key, len(self._mm))
        self.n_pieces = len(layout.pieces)
        main = "NumberOfPolys" if kind == "PolyData" else "NumberOfCells"
        #: main cells (polygons of PolyData) of every piece, from the XML alone
        self.piece_cells = [_int_attr(p, main, 0) for p in layout.pieces]
        if self._piece is None and len(layout.pieces) != 1:
            raise SeveralPieces(f"{len(layout.pieces)} pieces")
        at = 0 if self._piece is None else self._piece
        if not 0 <= at < len(layout.pieces):
            msg = f"piece={at} out of range: the file has {len(layout.pieces)} pieces"
            raise ValueError(msg)
        piece = layout.pieces[at]
        self.kind = kind
        self.piece_attrs = piece
        self.n_points = _int_attr(piece, "NumberOfPoints")
        arrays = [a for a in layout.arrays
                  if a.path[:3] == ("VTKFile", kind, "Piece") and a.piece == at]  # fmt: skip
        if kind == "PolyData":
            self._n_main = _int_attr(piece, "NumberOfPolys", 0)
            keys = ("NumberOfVerts", "NumberOfLines", "NumberOfStrips")
            self.n_other_cells = sum(_int_attr(piece, k, 0) for k in keys)
            cells_tag = "Polys"
        else:
            self._n_main = _int_attr(piece, "NumberOfCells")
            self.n_other_cells = 0
            cells_tag = "Cells"
            # polyhedra: ``connectivity`` lists each cell's points, as for any cell; their face
            # streams (faces/faceoffsets, or face_connectivity/... from VTK 9.4) are decoded
            # by :meth:`polyhedra` only
        self.n_cells = self._n_main + self.n_other_cells
        self._dec = _Decoder(self._mm, layout, self._pool, self._threads)
        pts = _pick(arrays, "Points")
        if len(pts) != 1:
            raise CorruptVtkXml(f"{len(pts)} point arrays")
        if _int_attr(pts[0].attrs, "NumberOfComponents", 1, tag="<Points> array") != 3:
            raise CorruptVtkXml("points without 3 components")
        self._pts = pts[0]
        off_a = _pick(arrays, cells_tag, "offsets")
        con_a = _pick(arrays, cells_tag, "connectivity")
        if self._n_main and (len(off_a) != 1 or len(con_a) != 1):
            raise CorruptVtkXml(f"<{cells_tag}> without one offsets and one connectivity")
        self._off = off_a[0] if self._n_main else None
        self._con = con_a[0] if self._n_main else None
        self._arrays = arrays  # this piece's, for vtkguard's checks
        self._cell_arrays = {a.attrs.get("Name", ""): a for a in _pick(arrays, cells_tag)}
        self._cells = {a.attrs.get("Name", ""): a for a in reversed(_pick(arrays, "CellData"))}
        self.cell_array_names = [a.attrs.get("Name", "") for a in _pick(arrays, "CellData")]

    def close(self) -> None:
        """Stop the decoding threads (the mapping closes once no returned array uses it)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> VtkXmlFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ whole arrays
    def _components(self, name: str) -> int:
        tag = f"cell array {name!r}"
        comps = _int_attr(self._cells[name].attrs, "NumberOfComponents", 1, tag=tag)
        if comps < 1:
            raise CorruptVtkXml(f"{tag}: NumberOfComponents={comps}")
        return comps

    def _checked_offsets(self, ends: np.ndarray) -> np.ndarray:
        """Full ``(n + 1,)`` offsets from the file's end offsets, checked monotone."""
        if ends.dtype.kind not in "iu":
            raise CorruptVtkXml(f"offsets of type {ends.dtype}, not integers")
        full = np.empty(ends.size + 1, dtype=np.int64)
        full[0] = 0
        full[1:] = ends  # (a UInt64 past 2**63 wraps negative: caught below)
        bad = np.flatnonzero(full[1:] < full[:-1])
        if bad.size:
            i = int(bad[0])
            raise CorruptVtkXml(
                f"offsets decrease at cell {i} ({int(full[i])} -> {int(full[i + 1])})"
            )
        return full

    def _check_ids(self, conn: np.ndarray) -> None:
        if conn.dtype.kind not in "iu":
            raise CorruptVtkXml(f"connectivity of type {conn.dtype}, not integers")
        if conn.size:
            lo, hi = int(conn.min()), int(conn.max())
            if lo < 0 or hi >= self.n_points:
                bad = lo if lo < 0 else hi
                raise CorruptVtkXml(
                    f"connectivity refers to point {bad}, but the file has {self.n_points} "
                    "points (NumberOfPoints)"
                )

    def check(self, names: Iterable[str] = ()) -> None:
        """Check the declared sizes of the points, the offsets and the cell arrays ``names``
        (those present) against the counts and the file, decoding nothing; call it before
        allocating outputs sized by :attr:`n_cells` or :attr:`n_points`.

        Raises
        ------
        CorruptVtkXml
            Naming the file and the array whose size does not add up.
        UnsupportedVtkXml
            An array in a layout this reader does not decode.
        """
        with self._named():
            self._dec.check(self._pts, 3 * self.n_points, "points")
            if self._off is not None:
                self._dec.check(self._off, self._n_main, "offsets")
            for name in names:
                if name in self._cells:
                    count = self._components(name) * self.n_cells
                    self._dec.check(self._cells[name], count, f"cell array {name!r}")

    def points(self) -> np.ndarray:
        """``(n_points, 3)`` in the file's precision."""
        with self._named():
            pts = self._dec.array(self._pts, 3 * self.n_points, "points")
            self._dec.finish()
            return _native(pts).reshape(self.n_points, 3)

    def offsets(self) -> np.ndarray:
        """``(n + 1,)`` int64: cell ``i`` is ``connectivity[offsets[i]:offsets[i + 1]]``."""
        if self._offsets is None:
            if self._off is None:
                self._offsets = np.zeros(1, dtype=np.int64)
            else:
                with self._named():
                    ends = self._dec.array(self._off, self._n_main, "offsets")
                    self._dec.finish()
                    self._offsets = self._checked_offsets(ends)
        return self._offsets

    def types(self) -> np.ndarray | None:
        """``(n_cells,)`` VTK cell types of an UnstructuredGrid (None for PolyData)."""
        if self.kind != "UnstructuredGrid":
            return None
        arr = self._cell_arrays.get("types")
        if arr is None:
            if self._n_main:
                raise CorruptVtkXml("<Cells> without its types array")
            return np.zeros(0, dtype=np.uint8)
        with self._named():
            types = self._dec.array(arr, self._n_main, "types")
            self._dec.finish()
            return _native(types).astype(np.uint8, copy=False)

    def polyhedra(self) -> PolyhedronFaces | None:
        """The faces of the polyhedral cells (VTK type 42), from either layout VTK writes
        (``faces``/``faceoffsets``, or VTK 9.4's ``face_connectivity``, ``face_offsets``,
        ``polyhedron_to_faces``, ``polyhedron_offsets``), checked against the points and the
        cell types; None when the file has no polyhedra.

        Raises
        ------
        CorruptVtkXml
            Polyhedra without faces, or faces that do not add up (named).
        """
        types = self.types()
        if types is None or not (types == VTK_POLYHEDRON).any():
            return None
        with self._named():
            return self._polyhedra(types)

    def _polyhedra(self, types: np.ndarray) -> PolyhedronFaces:
        have = self._cell_arrays
        dec, n = self._dec, self._n_main

        def whole(name: str, count: int | None = None) -> np.ndarray:
            arr = have[name]
            what = f"<Cells> {name}"
            got = dec.array(arr, dec.declared(arr, what) if count is None else count, what)
            dec.finish()
            got = _native(got)
            if got.dtype.kind not in "iu":
                raise CorruptVtkXml(f"{what} of type {got.dtype}, not integers")
            return got.astype(np.int64, copy=False)

        new = ("face_connectivity", "face_offsets", "polyhedron_to_faces", "polyhedron_offsets")
        try:
            if all(k in have for k in new):
                fc, fo = whole("face_connectivity"), whole("face_offsets")
                cf, co = whole("polyhedron_to_faces"), whole("polyhedron_offsets", n)
                zero = np.zeros(1, dtype=np.int64)
                poly = PolyhedronFaces.from_arrays(fc, np.concatenate([zero, fo]), cf,
                                                   np.concatenate([zero, co]))  # fmt: skip
            elif "faces" in have and "faceoffsets" in have:
                poly = PolyhedronFaces.from_legacy(whole("faces"), whole("faceoffsets", n))
            else:
                raise CorruptVtkXml(
                    f"{int((types == VTK_POLYHEDRON).sum())} polyhedral cells but <Cells> has "
                    "no faces/faceoffsets (or face_connectivity, ...) arrays"
                )
            poly.check(self.n_points, types)
        except ValueError as exc:
            if isinstance(exc, CorruptVtkXml):
                raise
            raise CorruptVtkXml(f"polyhedron faces: {exc}") from None
        return poly

    def read(self, names: Iterable[str]) -> CellMesh:
        """Points, cells and the cell arrays ``names`` (those present), decoded whole; the
        arrays' base64 decoding and decompression overlap on the thread pool."""
        with self._named():
            return self._read(names)

    def _read(self, names: Iterable[str]) -> CellMesh:
        dec, n_main, n_cells = self._dec, self._n_main, self.n_cells
        points = dec.array(self._pts, 3 * self.n_points, "points").reshape(self.n_points, 3)
        first = len(dec.futures)
        ends = dec.array(self._off, n_main, "offsets") if n_main else np.zeros(0, np.int64)
        mine = dec.futures[first:]
        cell_data = {}
        for name in names:
            if name not in self._cells:
                continue
            comps = self._components(name)
            a = dec.array(self._cells[name], comps * n_cells, f"cell array {name!r}")
            cell_data[name] = a.reshape(n_cells, comps) if comps > 1 else a
        # the connectivity's length is the last offset: a damaged header can then not make
        # it allocate an absurd buffer (the offsets decompress while the fields' base64 is
        # decoded)
        for f in mine:
            f.result()
        offsets = self._checked_offsets(ends)
        n_conn = int(offsets[-1])
        conn = dec.array(self._con, n_conn, "connectivity") if n_main else np.zeros(0, np.int64)
        dec.finish()
        conn = _native(conn)
        self._check_ids(conn)
        return CellMesh(
            points=_native(points),
            offsets=offsets,
            connectivity=conn,
            cell_data={k: _native(v) for k, v in cell_data.items()},
            cell_array_names=list(self.cell_array_names),
            n_other_cells=self.n_other_cells,
        )

    # ------------------------------------------------------------------ pieces
    def pieces(self, name: str | None, rows: int):
        """Stream cell array ``name`` (or, for ``None``, the connectivity) in consecutive
        pieces: yields ``(first row, piece)`` with pieces of about ``rows`` rows, shape
        ``(m,)`` or ``(m, components)``; connectivity pieces are checked against the point
        count and hold ``rows`` ids or so, whatever the cells."""
        if rows < 1:
            msg = f"rows={rows} must be >= 1"
            raise ValueError(msg)
        with self._named():
            yield from self._pieces(name, rows)

    def _pieces(self, name: str | None, rows: int):
        if name is None:
            if self._con is None:
                return
            count = int(self.offsets()[-1])
            for v0, piece in self._dec.pieces(self._con, count, rows, 1, "connectivity"):
                self._check_ids(piece)
                yield v0, piece
            return
        comps = self._components(name)
        what = f"cell array {name!r}"
        count = comps * self.n_cells
        for v0, piece in self._dec.pieces(self._cells[name], count, rows * comps, comps, what):
            yield v0 // comps, piece.reshape(-1, comps) if comps > 1 else piece


def read_cells(
    path: str | Path, names: Iterable[str], *, threads: int | None = None,
    piece: int | None = None,
) -> CellMesh:  # fmt: skip
    """Points, cells and the cell arrays ``names`` (those present) of a VTK XML mesh.

    Parameters
    ----------
    path : path
        A ``.vtp`` (polygons are read) or ``.vtu`` file.
    names : iterable of str
        Cell arrays to decode; absent names are simply not in ``cell_data``.
    threads : int, optional
        Decompression threads (default: :func:`default_threads`).
    piece : int, optional
        Read only this ``<Piece>`` of a file with several (default: the file must hold one).

    Raises
    ------
    UnsupportedVtkXml
        A feature this reader does not decode (VTK may read the file).
    CorruptVtkXml
        The file is damaged (named, with what is wrong); do not hand it to another reader.
    OSError
        The file cannot be opened.
    """
    with VtkXmlFile(path, threads=threads, piece=piece) as f:
        return f.read(names)
