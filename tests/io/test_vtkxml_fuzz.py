"""Fuzzing meshshard's VTK XML reading (issue 10): random byte flips, truncations and header
edits of small generated files in several layouts. Every case must end in output identical to
the undamaged file's (the store is written from it) or in an InputFileError naming the file;
never a crash, a hang, another exception or different data.

The cases run in a child process (``tests/io/_fuzz.py``), so a segfault in a reader
(VTK still reads the layouts meshshard's reader does not) fails the test and names the case.
Flips in uncompressed layouts avoid the array values themselves: a changed value there is a
valid, different file that no reader can detect; compressed layouts (zlib's adler32, xz's
crc64) are flipped anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from meshshard.datasets.drivaerml import read_surface
from tests.pipelines._damage import surface_mesh, volume_mesh, write_vtk

SEED = 20261201
#: (suffix, mode, compressor, header) of the base files
LAYOUTS = [
    (".vtp", "binary", "ZLib", "UInt32"),
    (".vtp", "appended-raw", "ZLib", "UInt64"),
    (".vtp", "appended-base64", "ZLib", "UInt32"),
    (".vtp", "appended-raw", "LZMA", "UInt32"),
    (".vtp", "appended-raw", "None", "UInt32"),
    (".vtp", "binary", "None", "UInt64"),
    (".vtu", "appended-raw", "ZLib", "UInt32"),
    (".vtu", "binary", "ZLib", "UInt64"),
    (".vtu", "appended-raw", "None", "UInt32"),
]
CASES = {"flip": 20, "truncate": 6, "edit": 20}  # per layout: 9 x 46 = 414 cases


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    out = []
    for i, (suffix, mode, comp, header) in enumerate(LAYOUTS):
        mesh = surface_mesh(120) if suffix == ".vtp" else volume_mesh()
        path = write_vtk(mesh, root / f"base{i}{suffix}", mode, comp, header, block=256)
        out.append({"index": i, "path": str(path), "compressed": comp != "None",
                    "layout": f"{suffix[1:]}/{mode}/{comp}/{header}"})  # fmt: skip
    return root, out


def test_fuzzed_files_give_the_same_output_or_a_clear_error(bases, tmp_path):
    root, base_files = bases
    spec = tmp_path / "spec.json"
    out = tmp_path / "out.json"
    spec.write_text(json.dumps({"seed": SEED, "bases": base_files, "cases": CASES,
                                "work": str(tmp_path)}))  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.getcwd(), MESHSHARD_READ_THREADS="2")
    try:
        p = subprocess.run([sys.executable, "-m", "tests.io._fuzz", str(spec), str(out)],
                           capture_output=True, text=True, timeout=240, env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        last = (tmp_path / "out.json.progress").read_text()
        pytest.fail(f"the fuzz child hung; last case: {last}")
    if p.returncode != 0:
        last = (tmp_path / "out.json.progress").read_text()
        pytest.fail(f"the fuzz child died (rc={p.returncode}) in case {last}:\n{p.stderr[-3000:]}")
    results = json.loads(out.read_text())
    assert len(results) == len(LAYOUTS) * sum(CASES.values())
    bad = [r for r in results if r["outcome"] not in ("same", "error")]
    assert not bad, "\n".join(f"{r['case']}: {r['outcome']}" for r in bad[:20])
    counts = Counter(r["outcome"] for r in results)
    # the cases are not all trivially refused or trivially harmless
    assert counts["error"] > len(results) // 3 and counts["same"] > 0, counts


def test_a_harmless_damage_gives_an_identical_store(tmp_path):
    """End to end: a flip in an array nobody reads leaves the written store identical."""
    import zarr

    from meshshard.pipelines import process_run

    mesh = surface_mesh(300)
    runs = {}
    for name, damage in (("good", False), ("flipped", True)):
        run = tmp_path / name / "run_1"
        run.mkdir(parents=True)
        path = write_vtk(mesh, run / "boundary_1.vtp", "appended-raw", "None")
        if damage:  # a value of the "extra" array, which the schema does not read
            raw = bytearray(path.read_bytes())
            at = raw.rindex(np.arange(mesh.n_cells, dtype="<i4").tobytes()) + 40
            raw[at] ^= 0xFF
            path.write_bytes(bytes(raw))
        res = process_run(run, tmp_path / name / "out", parts=3, volume=False)
        assert res.status == "written"
        runs[name] = zarr.open_group(res.path, mode="r")
    good, flipped = runs["good"], runs["flipped"]
    assert sorted(good.array_keys()) == sorted(flipped.array_keys())
    for k in good.array_keys():
        np.testing.assert_array_equal(good[k][...], flipped[k][...])
    assert read_surface(tmp_path / "flipped" / "run_1" / "boundary_1.vtp").fields.shape[0] == (
        mesh.n_cells
    )
