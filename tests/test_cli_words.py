"""User errors in the command's own words, exit code 2, said once: preprocess's per-run user
errors, ``--runs`` naming no run, a volume no run has, ``--parts 0``, a missing optional
partitioner, an empty directory, ``demo --steps``, a raw run directory given to ``inspect``,
and a ``MESHSHARD_READER`` that would be ignored."""

from __future__ import annotations

import pytest

from meshshard.cli import main


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """run_1 with a volume, run_2 and run_3 without; stores of run_1 and run_2 (2 parts)."""
    from meshshard.datasets import make_synthetic_run
    from meshshard.pipelines import preprocess_runs

    root = tmp_path_factory.mktemp("words")
    make_synthetic_run(root / "src", 1, surface_cells=600, volume_cells=300, seed=1)
    for i in (2, 3):
        make_synthetic_run(root / "src", i, surface_cells=600, volume_cells=0, seed=i)
    res = preprocess_runs(root / "src", root / "stores", parts=2, volume=False,
                          runs=["run_1", "run_2"], progress=False)
    assert [r.status for r in res] == ["written", "written"]
    return root


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def _one_line(err: str, *needles: str, absent: tuple[str, ...] = ()) -> str:
    lines = _lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith("meshshard ") and ": error: " in lines[0], err
    for n in needles:
        assert n in lines[0], lines[0]
    for n in absent:
        assert n not in lines[0], lines[0]
    return lines[0]


def _preprocess(raw, dst, *flags: str) -> list[str]:
    return ["preprocess", "drivaerml", str(raw / "src"), str(dst), "--no-progress", *flags]


def test_a_store_made_with_other_options_is_exit_2_and_said_once_per_run(raw, capfd):
    argv = _preprocess(raw, raw / "stores", "--parts", "3", "--surface", "--runs", "run_1",
                       "run_2")
    assert main(argv) == 2
    out, err = capfd.readouterr()
    assert "0 written, 0 skipped (up to date), 2 failed" in out
    for run in ("run_1", "run_2"):
        said = [ln for ln in _lines(err) if f"{run}.zarr: exists with other options" in ln]
        assert len(said) == 1, err  # not once by the worker's log and again by the command
        assert "parts 2 -> 3" in said[0] and "--overwrite" in said[0]
    assert "ERROR" not in err and "Traceback" not in err


def test_runs_naming_no_run_fails_before_any_worker(raw, tmp_path, capfd, monkeypatch):
    import meshshard.pipelines.preprocess as pp

    def no_workers(*a, **k):
        raise AssertionError("a worker pool was started")

    monkeypatch.setattr(pp, "WorkerPool", no_workers)
    dst = tmp_path / "dst"
    assert main(_preprocess(raw, dst, "--parts", "2", "--surface", "--runs", "run_9",
                            "run_1")) == 2
    _one_line(capfd.readouterr().err, "--runs run_9: no such run directory",
              "run_1, run_2, run_3", absent=("run_1:",))
    assert not dst.exists()
    # the library refuses it as early, in its own words
    with pytest.raises(FileNotFoundError, match="no run directory run_9"):
        pp.preprocess_runs(raw / "src", dst, parts=2, volume=False, runs=["run_9"])


def test_a_volume_no_run_has_is_one_line_pointing_at_surface(raw, tmp_path, capfd):
    dst = tmp_path / "dst"
    assert main(_preprocess(raw, dst, "--parts", "2", "--runs", "run_2", "run_3")) == 2
    _one_line(capfd.readouterr().err, "no volume_<i>.vtu in any of the 2 runs", "--surface")
    assert not dst.exists()
    # one run of two without its volume: that run fails alone, a user error (exit 2)
    assert main(_preprocess(raw, dst, "--parts", "2", "--runs", "run_1", "run_2")) == 2
    out, err = capfd.readouterr()
    assert "1 written, 0 skipped (up to date), 1 failed" in out
    assert len([ln for ln in _lines(err) if "volume_2.vtu: missing volume file" in ln]) == 1


@pytest.mark.parametrize(("flags", "said"), [
    (("--parts", "0"), "--parts 0 must be >= 1"),
    (("--parts", "2", "--workers", "0"), "--workers 0 must be >= 1"),
    (("--parts", "2", "--halo-radius", "0"), "--halo-radius 0.0 must be a number > 0"),
    (("--parts", "2", "--max-volume-cells", "-3"), "--max-volume-cells -3 must be >= 1"),
])
def test_preprocess_numbers_in_the_commands_words(raw, tmp_path, capfd, flags, said):
    assert main(_preprocess(raw, tmp_path / "dst", *flags)) == 2
    _one_line(capfd.readouterr().err, said, absent=("parts=", "workers=", "halo_radius="))


def test_a_missing_partitioner_says_how_to_install_it_from_the_checkout(raw, tmp_path, capfd,
                                                                       monkeypatch):
    from meshshard.partition import hypergraph, kaminpar_part

    monkeypatch.setattr(kaminpar_part, "WITH_KAMINPAR", False)
    monkeypatch.setattr(hypergraph, "WITH_MTKAHYPAR", False)
    vtp = raw / "src" / "run_2" / "boundary_2.vtp"
    assert main(["partition", str(vtp), "-p", "2", "-m", "kaminpar", "-o",
                 str(tmp_path / "p"), "--no-progress"]) == 2
    _one_line(capfd.readouterr().err, "--method kaminpar needs the kaminpar package",
              "pip install -e '.[kaminpar]'", "--method metis",
              absent=("method='", "pip install meshshard"))
    assert main(["inspect", str(vtp), "-p", "2", "-m", "hypergraph", "--no-progress"]) == 2
    _one_line(capfd.readouterr().err, "pip install -e '.[hypergraph]'",
              absent=("method='", "pip install meshshard"))
    assert main(_preprocess(raw, tmp_path / "d", "--parts", "2", "--method", "hypergraph")) == 2
    _one_line(capfd.readouterr().err, "--method hypergraph needs the mtkahypar package",
              "pip install -e '.[hypergraph]'")


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_an_empty_directory_is_called_empty(tmp_path, capfd, command):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = ([command, str(empty)] if command == "evaluate"
            else [command, str(tmp_path / "ckpt"), str(empty)])
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    _one_line(capfd.readouterr().err, "empty: is an empty directory", "run_<i>.zarr",
              absent=("DatasetSchema", "run_prefix"))


def test_demo_steps_blames_steps(capfd):
    assert main(["demo", "--steps", "-1"]) == 2
    _one_line(capfd.readouterr().err, "--steps -1 must be >= 1", absent=("--cells",))
    assert main(["demo", "--cells", "5"]) == 2
    _one_line(capfd.readouterr().err, "--cells 5 must be >= 100", absent=("--steps",))


def test_inspect_of_a_run_directory_points_at_its_files(raw, tmp_path, capfd):
    assert main(["inspect", str(raw / "src" / "run_1")]) == 2
    _one_line(capfd.readouterr().err, "a directory of meshes", "boundary_1.vtp --parts P",
              absent=("Partition.save",))
    (tmp_path / "nothing").mkdir()
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    _one_line(capfd.readouterr().err, "no partition.npz", absent=("Partition.save",))


@pytest.mark.parametrize("value", ["bogus", "VTK"])
def test_a_reader_setting_that_would_be_ignored_is_refused(raw, tmp_path, capfd, monkeypatch,
                                                           value):
    from meshshard.datasets.drivaerml import reader_mode

    monkeypatch.setenv("MESHSHARD_READER", value)
    with pytest.raises(ValueError, match="is not one of auto, vtk"):
        reader_mode()
    assert main(_preprocess(raw, tmp_path / "dst", "--parts", "2", "--surface")) == 2
    _one_line(capfd.readouterr().err, f"MESHSHARD_READER={value!r} is not one of auto, vtk")
    assert not (tmp_path / "dst").exists()
    for ok in ("vtk", "auto", ""):
        monkeypatch.setenv("MESHSHARD_READER", ok)
        assert reader_mode() == (ok or "auto")
