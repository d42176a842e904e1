"""preprocess_runs passes its options to process_run as one typed value (RunOptions): a
misspelt or bad one fails at once, naming the valid ones, instead of failing every run inside
its worker."""

from __future__ import annotations

import dataclasses

import pytest

from meshshard.datasets import make_synthetic_run
from meshshard.pipelines import RunOptions, preprocess_runs, process_run
from meshshard.pipelines.distributed import preprocess_distributed
from meshshard.store import open_store


def test_a_misspelt_option_is_refused_before_any_run(tmp_path):
    make_synthetic_run(tmp_path / "raw", 1, surface_cells=200, volume_cells=0, seed=1)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['volumee'\].*'volume'"):
        preprocess_runs(tmp_path / "raw", tmp_path / "out", parts=2, volumee=False)
    assert not (tmp_path / "out").exists()



def test_options_are_one_typed_value_checked_when_made():
    opts = RunOptions(parts=3, volume=False, halo_radius=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.parts = 4  # type: ignore[misc]
    assert opts.request()["parts"] == 3 and opts.request()["surface"] is True
    assert "graph" not in opts.request() and RunOptions(parts=1, graph="dual").request()[
        "graph"] == "dual"  # fmt: skip
    for bad, match in [({"parts": 0}, "parts=0 must be"), ({"method": "kd"}, "method='kd'"),
                       ({"surface": False, "volume": False}, "nothing to do"),
                       ({"halo_radius": 0}, "halo_radius=0 must be > 0"),
                       ({"max_volume_cells": 0}, "max_volume_cells=0"),
                       ({"graph": "primal"}, "graph='primal' is not one of")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            RunOptions(**{"parts": 2, **bad})
    with pytest.raises(TypeError):
        RunOptions(2)  # type: ignore[misc]  (keywords only: no silent positional mix-up)


def test_keywords_or_a_runoptions_not_both_and_parts_required(tmp_path):
    make_synthetic_run(tmp_path / "raw", 1, surface_cells=200, volume_cells=0, seed=1)
    out = tmp_path / "out"
    for call, match in [
        (lambda: preprocess_runs(tmp_path / "raw", out, volume=False), "parts .* is required"),
        (lambda: preprocess_runs(tmp_path / "raw", out, RunOptions(parts=2), volume=False),
         r"not both \(got \['volume'\]"),
        (lambda: preprocess_runs(tmp_path / "raw", out, {"parts": 2}),
         "options must be a RunOptions, got dict"),
        (lambda: process_run(tmp_path / "raw" / "run_1", out, parts=2, metod="rcb"),
         r"process_run: unknown option\(s\) \['metod'\].*'method'"),
    ]:
        with pytest.raises(TypeError, match=match):
            call()
    with pytest.raises(ValueError, match="graph='primal'"):
        preprocess_runs(tmp_path / "raw", out, parts=2, graph="primal")
    assert not out.exists()


def test_a_runoptions_writes_what_the_same_keywords_write(tmp_path):
    make_synthetic_run(tmp_path / "raw", 1, surface_cells=300, volume_cells=0, seed=2)
    kw = {"parts": 2, "method": "morton", "volume": False, "halo_radius": 0.4}
    a = preprocess_runs(tmp_path / "raw", tmp_path / "a", progress=False, **kw)
    b = preprocess_runs(tmp_path / "raw", tmp_path / "b", RunOptions(**kw), progress=False)
    assert [r.status for r in a + b] == ["written", "written"]
    sa, sb = (open_store(tmp_path / d / "run_1.zarr")[1] for d in "ab")
    assert sa["request"] == sb["request"]
    assert sa["request"]["method"] == "morton" and sa["request"]["halo_radius"] == 0.4
    assert sa["surface"]["partition_ptr"] == sb["surface"]["partition_ptr"]
    # and a rerun with the typed options finds the keyword-written store up to date
    again = process_run(tmp_path / "raw" / "run_1", tmp_path / "a", RunOptions(**kw))
    assert again.status == "skipped"


def test_distributed_preprocessing_refuses_what_it_does_not_implement(tmp_path):
    # refused before the process group is made or any source is looked at
    opts = RunOptions(parts=2, halo_radius=0.5, graph="dual")
    with pytest.raises(ValueError, match=r"halo_radius=0\.5, graph='dual': not implemented"):
        preprocess_distributed(tmp_path / "missing", tmp_path / "out", opts)
    assert not (tmp_path / "out").exists()
