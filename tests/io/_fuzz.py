"""The fuzz cases over meshshard's VTK XML reading, run in a child process by
``test_vtkxml_fuzz.py``: ``python -m tests.io._fuzz SPEC OUT``.

SPEC (JSON) lists base files (path, layout, whether compressed) and how many cases of each
kind to make from each; every case is derived from ``(seed, base, kind, i)`` only. Before each
case the child writes its name to ``OUT.progress`` (so a crash names the case); at the end it
writes one JSON record per case to OUT: ``same`` (read, and equal to the undamaged file's
output), ``error`` (an InputFileError whose message starts with the file's path), or
anything else (a failure, described).
"""

from __future__ import annotations

import json
import mmap
import sys
from pathlib import Path

import numpy as np

#: hostile values for header edits
VALUES = ["-1", "0", "1", "2147483648", "4294967295", "1152921504606846976",
          "18446744073709551617", "abc", "", "1e3", "-8", " 7 "]  # fmt: skip
#: (attribute, replacement values) header edits pick from; counts also get n - 1 and n + 1
EDITS = {
    "NumberOfPoints": VALUES,
    "NumberOfCells": VALUES,
    "NumberOfPolys": VALUES,
    "NumberOfComponents": VALUES,
    "offset": VALUES,
    "type": ["Float64", "Int32", "UInt8", "String", "Float3", "PolyData", "ImageData",
             "UnstructuredGrid"],  # fmt: skip
    "format": ["ascii", "binary", "appended", "raw", ""],
    "header_type": ["UInt64", "UInt32", "UInt16", "Int64"],
    "byte_order": ["BigEndian", "LittleEndian", "Middle"],
    "compressor": ["vtkLZ4DataCompressor", "vtkLZMADataCompressor", "vtkZLibDataCompressor",
                   "vtkNoneCompressor"],  # fmt: skip
    "encoding": ["base64", "raw", "hex"],
    "Name": ["pMeanTrim", "wallShearStressMeanTrim", "extra", "x"],
    "version": ["0.1", "2.2", "x"],
}


def _payloads(path: Path) -> list[tuple[int, int]]:
    """Byte ranges holding uncompressed array values (a flip there changes a value, which no
    reader can tell from a real one): inline DataArray text, and appended data minus each
    array's size word."""
    from meshshard.io import vtkxml

    size = path.stat().st_size
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        layout = vtkxml._scan(mm)
    header = 8 if layout.root.get("header_type") == "UInt64" else 4
    ranges = [(a.start, a.end) for a in layout.arrays if a.attrs.get("format") == "binary"]
    if layout.appended is not None:
        base = layout.appended[1]
        word = header if layout.appended[0] == "raw" else -(-header // 3) * 4
        starts = sorted(int(a.attrs["offset"]) for a in layout.arrays if "offset" in a.attrs)
        for s0, s1 in zip(starts, starts[1:] + [size - base]):
            ranges.append((base + s0 + word, base + s1))
    return ranges


def make_case(raw: bytes, allowed: np.ndarray, kind: str, rng: np.random.Generator):
    """The damaged bytes of one case, and a short description; flips only where ``allowed``."""
    if kind == "truncate":
        cut = int(rng.integers(0, len(raw)))
        return raw[:cut], f"truncate at {cut}/{len(raw)}"
    if kind == "flip":
        out = bytearray(raw)
        where = np.flatnonzero(allowed)
        picks = rng.choice(where, size=int(rng.integers(1, 4)), replace=False)
        for at in picks:
            out[at] ^= int(rng.integers(1, 256))
        return bytes(out), f"flip {sorted(int(p) for p in picks)}"
    # header edit: one attribute of one element, set to a hostile value
    import re

    keys = [k for k in EDITS if re.search(rb'\b' + k.encode() + rb'="', raw)]
    key = keys[int(rng.integers(len(keys)))]
    hits = list(re.finditer(rb'\b' + key.encode() + rb'="([^"]*)"', raw))
    m = hits[int(rng.integers(len(hits)))]
    values = list(EDITS[key])
    if m.group(1).isdigit():
        n = int(m.group(1))
        values += [str(n - 1), str(n + 1), str(2 * n)]
    value = values[int(rng.integers(len(values)))]
    new = raw[: m.start(1)] + value.encode() + raw[m.end(1) :]
    return new, f"{key}: {m.group(1).decode()!r} -> {value!r} (#{hits.index(m)})"


def _read(path: Path) -> dict:
    from meshshard.datasets.drivaerml import read_surface, read_volume

    if path.suffix == ".vtu":
        d = read_volume(path, length=1.0)
        return {"centers": d.centers, "fields": d.fields, "source": d.source_index}
    d = read_surface(path)
    return {"centers": d.centers, "normals": d.normals, "areas": d.areas, "fields": d.fields,
            "source": d.source_index}  # fmt: skip


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k])
        for k in a
    )


def main(spec_path: str, out_path: str) -> None:
    from meshshard.io.errors import InputFileError

    spec = json.loads(Path(spec_path).read_text())
    work = Path(spec["work"])
    progress = Path(out_path + ".progress")
    results = []
    for base in spec["bases"]:
        src = Path(base["path"])
        raw = src.read_bytes()
        allowed = np.ones(len(raw), bool)
        if not base["compressed"]:
            for a, b in _payloads(src):
                allowed[a:b] = False
        want = _read(src)
        for kind, count in spec["cases"].items():
            for i in range(count):
                rng = np.random.default_rng([spec["seed"], base["index"], len(kind), i])
                data, what = make_case(raw, allowed, kind, rng)
                name = f"{base['layout']} {kind} #{i}: {what}"
                progress.write_text(name)
                path = work / f"case{src.suffix}"
                path.write_bytes(data)
                rec = {"case": name}
                try:
                    rec["outcome"] = "same" if _same(_read(path), want) else "DIFFERENT"
                except InputFileError as exc:
                    ok = str(exc).startswith(str(path))
                    rec["outcome"] = "error" if ok else f"unnamed: {exc}"
                    rec["msg"] = str(exc)[:300]
                except Exception as exc:
                    rec["outcome"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                results.append(rec)
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
