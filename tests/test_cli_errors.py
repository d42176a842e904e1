"""A user error is one line on stderr and exit code 2 (never a traceback, unless --debug);
every message names the real flag and object and says how to fix it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import pyvista as pv

from meshshard.cli import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_errors")
    grid = pv.ImageData(dimensions=(9, 7, 5)).cast_to_unstructured_grid()
    grid.point_data["Elevation"] = grid.points[:, 2].copy()
    grid.save(d / "grid.vtu")
    b = (d / "grid.vtu").read_bytes()
    (d / "cut.vtu").write_bytes(b[: len(b) // 3])
    sphere = pv.Sphere(theta_resolution=12, phi_resolution=12)
    sphere.points[5] = np.nan
    sphere.save(d / "nan.vtp")
    x = np.linspace(0, 1, 200)
    pts = np.c_[x, np.sin(6 * x), np.zeros_like(x)]
    segs = np.c_[np.full(199, 2), np.arange(199), np.arange(1, 200)].ravel()
    pv.PolyData(pts, lines=segs).save(d / "line.vtp")
    cloud = np.random.default_rng(0).random((300, 3))
    cloud[7] = np.inf
    np.save(d / "badcloud.npy", cloud)
    return d


def _one_line_error(capfd, *needles):
    captured = capfd.readouterr()
    err = captured.err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err  # one line, nothing from VTK, no traceback
    assert lines[0].startswith("meshshard ") and ": error: " in lines[0], err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _unwritable_dir():
    """A directory this process (even root) cannot create files in."""
    try:
        os.mkdir("/sys/meshshard-probe")
    except OSError:
        return "/sys"
    os.rmdir("/sys/meshshard-probe")  # pragma: no cover - not Linux
    pytest.skip("no unwritable directory here")


def test_unwritable_out_is_refused_before_reading(files, tmp_path, capfd):
    bad = _unwritable_dir()
    # the input does not even exist: the --out check comes first, before any work
    rc = main(["partition", str(tmp_path / "missing.vtu"), "-p", "2", "--out", f"{bad}/x"])
    assert rc == 2
    _one_line_error(capfd, f"--out {bad}/x: cannot write in {bad}")
    (tmp_path / "afile").write_text("")
    rc = main(["partition", str(files / "grid.vtu"), "-p", "2", "--out",
               str(tmp_path / "afile" / "sub")])  # fmt: skip
    assert rc == 2
    _one_line_error(capfd, "afile is a file, not a directory; choose another --out")


def test_unwritable_png_is_refused_before_the_work(files, tmp_path, capfd):
    bad = _unwritable_dir()
    grid = str(files / "grid.vtu")
    for argv in (["inspect", grid, "-p", "2"],
                 ["partition", grid, "-p", "2", "--out", str(tmp_path / "o")]):  # fmt: skip
        assert main([*argv, "--png", f"{bad}/shards.png"]) == 2
        _one_line_error(capfd, f"--png {bad}/shards.png: cannot write in {bad}")
        assert not (tmp_path / "o").exists()  # nothing computed, nothing written
    assert main(["inspect", str(files / "grid.vtu"), "-p", "2", "--png", str(tmp_path)]) == 2
    _one_line_error(capfd, "--png", "must end in .png")


def test_inspect_missing_target_names_it(capfd):
    assert main(["inspect", "nosuchdir/"]) == 2
    line = _one_line_error(capfd, "nosuchdir/: no such file or directory")
    assert "pass --parts" not in line and "is a mesh/points file" not in line


def test_too_many_parts_names_allow_empty_flag(files, tmp_path, capfd):
    out = str(tmp_path / "o")
    assert main(["partition", str(files / "grid.vtu"), "-p", "200", "--out", out]) == 2
    line = _one_line_error(capfd, "--parts 200 but only 192 cell(s)", "pass --allow-empty")
    assert "allow_empty=True" not in line
    assert "--on points (the mesh has 315 vertices)" in line
    assert main(["inspect", str(files / "grid.vtu"), "-p", "500"]) == 2
    _one_line_error(capfd, "pass --allow-empty")
    args = ["partition", str(files / "grid.vtu"), "-p", "200", "--allow-empty", "--out", out]
    assert main([*args, "--no-metrics", "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["empty_parts"] == 8


def test_point_field_as_weights_hints_on_points(files, tmp_path, capfd):
    args = ["partition", str(files / "grid.vtu"), "-p", "2", "--weights", "Elevation"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    _one_line_error(capfd, "no cell field 'Elevation'", "is a point field: add --on points")
    assert main([*args, "--on", "points", "--out", str(tmp_path / "b"), "--json"]) == 0
    assert "imbalance_weighted" in json.loads(capfd.readouterr().out)


def test_nan_coordinate_names_the_point(files, tmp_path, capfd):
    assert main(["partition", str(files / "nan.vtp"), "-p", "2", "--out", str(tmp_path / "a")]) == 2
    line = _one_line_error(capfd, "nan.vtp: point 5 has NaN or inf coordinates")
    assert "row" not in line
    assert main(["inspect", str(files / "badcloud.npy"), "-p", "2"]) == 2
    _one_line_error(capfd, "badcloud.npy: point 7 has NaN or inf coordinates")


def test_polyline_mesh_with_knn_graph(files, tmp_path, capfd):
    base = ["partition", str(files / "line.vtp"), "-p", "3"]
    assert main([*base, "--graph", "knn", "--out", str(tmp_path / "a"), "--json"]) == 0
    rep = json.loads(capfd.readouterr().out)
    assert rep["num_points"] == 199 and rep["edge_cut"] > 0  # cells (segments) on a kNN graph
    assert main([*base, "--out", str(tmp_path / "b"), "--json"]) == 0  # default: knn here
    assert json.loads(capfd.readouterr().out)["params"]["graph"] == "knn"
    assert main([*base, "--graph", "dual", "--out", str(tmp_path / "c")]) == 2
    _one_line_error(capfd, "line.vtp: the dual graph needs polygon or volume cells", "--graph knn")


def test_damaged_mesh_folds_vtk_output_into_one_line(files, tmp_path, capfd):
    assert main(["partition", str(files / "cut.vtu"), "-p", "2", "--out", str(tmp_path / "a")]) == 2
    line = _one_line_error(capfd, "cut.vtu: unreadable or truncated mesh file (VTK: ")
    assert "Error parsing" in line  # VTK's own words, once, inside meshshard's message


def test_debug_shows_the_traceback(files, tmp_path, capfd):
    argv = ["partition", str(files / "grid.vtu"), "-p", "0", "--out", str(tmp_path / "a")]
    assert main(argv) == 2
    _one_line_error(capfd, "--parts 0 must be >= 1")
    for args in (["--debug", *argv], [*argv, "--debug"]):
        assert main(args) == 2
        err = capfd.readouterr().err
        assert "Traceback (most recent call last)" in err and "CLIError" in err
        assert err.rstrip().splitlines()[-1] == "meshshard partition: error: --parts 0 must be >= 1"


def test_unexpected_error_exit_1_and_interrupt_exit_130(monkeypatch, capfd):
    import meshshard.commands.handlers.inspect as cmd

    def boom(args):
        raise RuntimeError("something broke")

    monkeypatch.setattr(cmd, "run", boom)
    assert main(["inspect", "x"]) == 1
    _one_line_error(capfd, "RuntimeError: something broke", "rerun with --debug")

    def interrupt(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cmd, "run", interrupt)
    assert main(["inspect", "x"]) == 130
    assert capfd.readouterr().err == "meshshard inspect: interrupted by SIGINT, stopped\n"


def test_os_errors_read_as_path_and_reason(tmp_path, capfd):
    from meshshard.cli import describe_error

    exc = PermissionError(13, "Permission denied", str(tmp_path / "f"))
    assert describe_error(exc).startswith(f"{tmp_path / 'f'}: Permission denied")


def test_no_metrics_skips_the_graph(files, tmp_path, capfd):
    out = tmp_path / "a"
    png = tmp_path / "a.png"
    argv = ["partition", str(files / "grid.vtu"), "-p", "3", "--no-metrics", "--out", str(out),
            "--png", str(png)]  # fmt: skip
    assert main(argv) == 0
    text = capfd.readouterr().out
    assert "edge cut, volume, halos and contiguity: skipped (--no-metrics)" in text
    m = json.loads((out / "metrics.json").read_text())
    assert "edge_cut" not in m and "graph" not in m["timings"] and m["imbalance"] >= 1.0
    assert png.is_file() and str(png) in text
    # metis still needs its graph, and the metrics reuse it unless skipped
    argv = ["partition", str(files / "grid.vtu"), "-p", "3", "-m", "metis", "--no-metrics",
            "--out", str(tmp_path / "b")]  # fmt: skip
    assert main(argv) == 0
    m = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert "graph" in m["timings"] and "edge_cut" not in m


def test_demo_options_and_out_checked_first(capfd):
    assert main(["demo", "--ranks", "0"]) == 2
    _one_line_error(capfd, "--ranks 0 must be >= 1")
    bad = _unwritable_dir()
    assert main(["demo", "--out", f"{bad}/demo"]) == 2
    _one_line_error(capfd, f"--out {bad}/demo: cannot write in {bad}")


def test_metrics_cut_and_auto_on_big_meshes(files, tmp_path, capfd, monkeypatch):
    import meshshard.commands.partition as cmd

    grid = str(files / "grid.vtu")
    assert main(["partition", grid, "-p", "3", "--out", str(tmp_path / "full"), "--json"]) == 0
    full = json.loads(capfd.readouterr().out)
    assert "components" in full and "graph" in full["timings"]  # small mesh: full by default
    argv = ["partition", grid, "-p", "3", "--metrics", "cut", "--out", str(tmp_path / "cut")]
    assert main([*argv, "--json"]) == 0
    cut = json.loads(capfd.readouterr().out)
    assert "graph" not in cut["timings"] and "components" not in cut
    for key in ("edge_cut", "comm_volume", "halo_sizes", "neighbours"):
        assert cut[key] == full[key], key
    assert main([*argv, "--force"]) == 0
    text = capfd.readouterr().out
    assert f"edge cut: {full['edge_cut']:,} edges" in text
    assert "not computed (--metrics cut counts cut faces only; --metrics full adds them)" in text
    assert main(["inspect", str(tmp_path / "full"), "--metrics", "cut", "--json"]) == 0
    again = json.loads(capfd.readouterr().out)
    assert again["edge_cut"] == full["edge_cut"] and "components" not in again
    monkeypatch.setattr(cmd, "AUTO_FULL_CELLS", 100)  # the grid has 192 cells: "big"
    assert main(["partition", grid, "-p", "3", "--out", str(tmp_path / "auto"), "--json"]) == 0
    auto = json.loads(capfd.readouterr().out)
    assert auto["edge_cut"] == full["edge_cut"] and "components" not in auto
    assert "above 100 cells the default counts cut faces only" in auto["graph_metrics"]
    pts = ["partition", str(files / "badcloud.npy"), "-p", "2", "--metrics", "cut", "--graph",
           "knn", "--out", str(tmp_path / "k")]  # fmt: skip
    assert main(pts) == 2
    _one_line_error(capfd, "--metrics cut counts faces of the dual graph", "--metrics full")


def test_bad_npy_files_say_what_is_wrong(tmp_path, capfd):
    (tmp_path / "text.npy").write_text("garbage\n")
    np.save(tmp_path / "objects.npy", np.array([{}, 1], dtype=object), allow_pickle=True)
    np.save(tmp_path / "short.npy", np.zeros((10, 3)))
    (tmp_path / "short.npy").write_bytes((tmp_path / "short.npy").read_bytes()[:150])
    for name, needle in (("text", "not a .npy file (no NumPy header)"),
                         ("objects", "holds Python objects, not numbers"),
                         ("short", "unreadable or truncated .npy file")):  # fmt: skip
        out = str(tmp_path / f"o_{name}")
        assert main(["partition", str(tmp_path / f"{name}.npy"), "-p", "2", "--out", out]) == 2
        line = _one_line_error(capfd, f"{name}.npy: {needle}")
        assert "allow_pickle" not in line


def test_preprocess_into_an_unwritable_dst_is_one_line_and_exit_2(tmp_path, capfd):
    # was: one "ERROR ... failed: PermissionError" log line, one per-run line and the summary,
    # exit 1 -- for a DST nothing could ever be written into
    from meshshard.datasets import make_synthetic_run

    make_synthetic_run(tmp_path / "src", 1, surface_cells=200, volume_cells=0, seed=1)
    bad = _unwritable_dir()
    argv = ["preprocess", "drivaerml", str(tmp_path / "src"), f"{bad}/stores", "--parts", "2",
            "--surface", "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    _one_line_error(capfd, f"DST {bad}/stores: cannot write in {bad}")
    (tmp_path / "afile").write_text("")
    argv[3] = str(tmp_path / "afile")
    assert main(argv) == 2
    _one_line_error(capfd, "afile exists and is not a directory")


def _every_error_class():
    from meshshard.apps.model_file import ModelFileError
    from meshshard.cli import CLIError
    from meshshard.comm.check import CollectiveMismatchError, CollectiveWaitError
    from meshshard.comm.host import ExchangeError
    from meshshard.io import CorruptVtkXml, InputFileError, UnsupportedVtkXml
    from meshshard.io.vtkxml import SeveralPieces
    from meshshard.parallel._safe_dcp import UnsafeCheckpoint
    from meshshard.parallel.checkpoint import CheckpointError
    from meshshard.parallel.tensor import TensorParallelPlanError
    from meshshard.pipelines._runlock import RunBusy
    from meshshard.pipelines._workers import TaskError
    from meshshard.store import StoreError
    from meshshard.testing.distributed import RankError

    # (class, the builtin its callers caught before the family existed)
    return [
        (CLIError, Exception), (InputFileError, ValueError), (CorruptVtkXml, ValueError),
        (UnsupportedVtkXml, ValueError), (SeveralPieces, ValueError), (ModelFileError, ValueError),
        (StoreError, ValueError), (CheckpointError, ValueError), (UnsafeCheckpoint, ValueError),
        (TensorParallelPlanError, ValueError), (RunBusy, RuntimeError), (TaskError, RuntimeError),
        (ExchangeError, RuntimeError), (CollectiveMismatchError, RuntimeError),
        (CollectiveWaitError, RuntimeError), (RankError, RuntimeError),
    ]  # fmt: skip


def test_every_error_is_in_the_family_and_still_its_builtin():
    from meshshard.errors import MeshShardError

    for cls, builtin in _every_error_class():
        assert issubclass(cls, MeshShardError), cls
        assert issubclass(cls, builtin), cls


@pytest.mark.parametrize(
    ("kind", "code"),
    [("InputError", 2), ("LayoutError", 2), ("StoreError", 2), ("DistributedError", 1)],
)
def test_the_family_is_one_line_exit_2_or_1_for_a_failed_run(kind, code, capfd, monkeypatch):
    import meshshard.commands.handlers.inspect as cmd
    import meshshard.errors as errors

    def fail(args):
        raise getattr(errors, kind)("rank 3 stopped answering" if code == 1 else "bad thing")

    monkeypatch.setattr(cmd, "run", fail)
    assert main(["inspect", "x"]) == code
    line = _one_line_error(capfd)
    assert line.endswith("bad thing" if code == 2 else "rank 3 stopped answering"), line
    assert "--debug" not in line and kind not in line  # the family's messages are for users
