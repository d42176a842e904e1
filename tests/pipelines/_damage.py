"""Small VTK XML files in VTK's layouts, and ways to damage them (for the hardening tests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

#: the DrivaerML surface fields (the default schema reads these)
SURFACE_FIELDS = {"pMeanTrim": 1, "wallShearStressMeanTrim": 3}
VOLUME_FIELDS = {"UMeanTrim": 3, "pMeanTrim": 1, "nutMeanTrim": 1}


def surface_mesh(cells: int = 200, seed: int = 0):
    """A small closed surface of triangles and quads with the DrivaerML surface fields."""
    import pyvista as pv

    n = max(4, int(np.sqrt(cells / 2)))
    mesh = pv.Sphere(theta_resolution=n + 3, phi_resolution=n)
    rng = np.random.default_rng(seed)
    for name, comps in SURFACE_FIELDS.items():
        shape = (mesh.n_cells,) if comps == 1 else (mesh.n_cells, comps)
        mesh.cell_data[name] = rng.normal(size=shape).astype(np.float32)
    mesh.cell_data["extra"] = np.arange(mesh.n_cells, dtype=np.int32)  # read by nobody
    return mesh


def volume_mesh(seed: int = 0):
    """A small hexahedral grid with the DrivaerML volume fields."""
    import pyvista as pv

    grid = pv.ImageData(dimensions=(5, 4, 4)).cast_to_unstructured_grid()
    rng = np.random.default_rng(seed)
    for name, comps in VOLUME_FIELDS.items():
        shape = (grid.n_cells,) if comps == 1 else (grid.n_cells, comps)
        grid.cell_data[name] = rng.normal(size=shape).astype(np.float32)
    return grid


def write_vtk(mesh, path, mode="appended-raw", compressor="None", header="UInt32",
              ids="Int64", block=None, order=None) -> Path:  # fmt: skip
    """Write ``mesh`` with VTK's XML writer in one of its layouts: ``mode`` ascii, binary
    (inline base64), appended-raw or appended-base64; ``compressor`` None, ZLib or LZMA;
    ``order`` BigEndian or LittleEndian (default: VTK's)."""
    from vtkmodules import vtkIOXML

    path = Path(path)
    cls = vtkIOXML.vtkXMLPolyDataWriter if path.suffix == ".vtp" else None
    w = (cls or vtkIOXML.vtkXMLUnstructuredGridWriter)()
    w.SetInputData(mesh)
    w.SetFileName(str(path))
    if mode == "binary":
        w.SetDataModeToBinary()
    elif mode == "ascii":
        w.SetDataModeToAscii()
    else:
        w.SetDataModeToAppended()
        w.SetEncodeAppendedData(mode == "appended-base64")
    getattr(w, f"SetCompressorTypeTo{compressor}")()
    getattr(w, f"SetHeaderTypeTo{header}")()
    getattr(w, f"SetIdTypeTo{ids}")()
    if order:
        getattr(w, f"SetByteOrderTo{order}")()
    if block:
        w.SetBlockSize(block)
    assert w.Write() == 1
    return path


def write_two_pieces(mesh, path, compressor="None") -> Path:
    """``mesh`` written by VTK's XML writer as two ``<Piece>`` elements (appended raw data);
    VTK writes the whole mesh into each, and its readers return them concatenated."""
    from vtkmodules import vtkIOXML

    path = Path(path)
    cls = vtkIOXML.vtkXMLPolyDataWriter if path.suffix == ".vtp" else None
    w = (cls or vtkIOXML.vtkXMLUnstructuredGridWriter)()
    w.SetInputData(mesh)
    w.SetFileName(str(path))
    w.SetNumberOfPieces(2)
    w.SetDataModeToAppended()
    w.EncodeAppendedDataOff()
    getattr(w, f"SetCompressorTypeTo{compressor}")()
    assert w.Write() == 1
    return path


def set_array_attr(raw: bytes, name: str, key: str, value, *, nth: int = 0) -> bytes:
    """``raw`` with attribute ``key`` of the ``nth`` DataArray named ``name`` set to ``value``."""
    hits = list(re.finditer(rb'<DataArray[^>]*Name="' + name.encode() + rb'"[^>]*>', raw))
    m = hits[nth]
    return raw[: m.start()] + set_attr(m.group(0), key, value) + raw[m.end() :]


def set_attr(raw: bytes, key: str, value, *, nth: int = 0) -> bytes:
    """``raw`` with the ``nth`` ``key="..."`` attribute set to ``value``."""
    hits = list(re.finditer(rb'\b' + key.encode() + rb'="[^"]*"', raw))
    m = hits[nth]
    return raw[: m.start()] + f'{key}="{value}"'.encode() + raw[m.end() :]


def array_tag(raw: bytes, name: str) -> re.Match:
    """The ``<DataArray ... Name="name" ...>`` tag."""
    return re.search(rb'<DataArray[^>]*Name="' + name.encode() + rb'"[^>]*>', raw)


_TRAILER = b"\n  </AppendedData>\n</VTKFile>\n"


def append_block(raw: bytes, name: str, block: bytes) -> bytes:
    """Point appended array ``name`` at ``block`` (its header and data), added after the
    appended data (the file must be appended, as VTK writes it)."""
    assert raw.endswith(_TRAILER)
    tag = array_tag(raw, name)
    placeholder = b'offset="' + b"0" * 20 + b'"'
    new_tag = re.sub(rb'offset="\d+"', placeholder, tag.group(0))
    new = raw[: tag.start()] + new_tag + raw[tag.end() : -len(_TRAILER)]
    data_start = new.index(b"_", new.index(b"<AppendedData")) + 1
    offset = f'offset="{len(new) - data_start:020d}"'.encode()
    return new.replace(placeholder, offset, 1) + block + _TRAILER


def words(values, header="UInt32") -> bytes:
    return np.asarray(values, dtype="<u4" if header == "UInt32" else "<u8").tobytes()


def run_child(code: str, *args: str, limit_mb: int | None = None, timeout: float = 120.0):
    """Run ``code`` in a fresh Python (``sys.argv[1:] = args``); with ``limit_mb``, under an
    address-space limit of that many MiB above what the child holds once meshshard, numpy and
    VTK are imported. The child prints one JSON line last; returns (returncode, parsed JSON or
    None, stderr). A child killed by a signal has a negative return code."""
    prelude = textwrap.dedent(
        """
        import json, resource, sys
        import numpy as np, pyvista, vtkmodules.vtkIOXML
        import meshshard.datasets.drivaerml, meshshard.io.vtkxml
        LIMIT = {limit}
        if LIMIT:
            with open("/proc/self/status") as fh:
                vm = next(int(l.split()[1]) for l in fh if l.startswith("VmSize:")) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (vm + LIMIT * 2**20, resource.RLIM_INFINITY))
        """
    ).format(limit=limit_mb or 0)
    env = dict(os.environ, PYTHONPATH=os.getcwd(), MESHSHARD_READ_THREADS="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")  # fmt: skip
    p = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    return p.returncode, (json.loads(lines[-1]) if lines else None), p.stderr
