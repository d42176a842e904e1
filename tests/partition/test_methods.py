"""The one registry of partition methods: a method registered in Python, or through the
``meshshard.partition_methods`` entry-point group, works from :func:`partition`,
:class:`RunOptions`, preprocessing (its worker processes too) and ``meshshard partition``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from meshshard.partition import list_methods, method_info, partition, register_method
from meshshard.partition import methods as registry
from meshshard.pipelines import RunOptions, preprocess_runs
from tests.partition._methods_fns import x_slabs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def slabs():
    register_method("x_slabs", x_slabs, summary="slabs along x")
    yield "x_slabs"
    registry._METHODS.pop("x_slabs", None)


def test_builtin_names_and_graph_flags():
    assert {"hilbert", "morton", "rcb", "metis", "kaminpar", "hypergraph"} <= set(list_methods())
    assert set(list_methods(graph=True)) >= {"metis", "kaminpar", "hypergraph"}
    assert not {"hilbert", "morton", "rcb"} & set(list_methods(graph=True))
    assert method_info("hypergraph").extra == "hypergraph"


def test_double_registration_refused_unless_override(slabs):
    with pytest.raises(ValueError, match="already registered"):
        register_method(slabs, x_slabs)
    with pytest.raises(ValueError, match="already registered"):
        register_method("rcb", x_slabs)
    register_method(slabs, x_slabs, override=True)
    with pytest.raises(TypeError, match="module:function"):
        register_method("bad", "no_colon_here")
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        partition(np.zeros((4, 3)), 2, method="nope")


def test_registered_method_in_partition_and_run_options(slabs):
    pts = np.random.default_rng(0).random((101, 3))
    p = partition(pts, 3, method=slabs)
    assert p.method == "x_slabs" and p.sizes.tolist() == [34, 34, 33]
    assert RunOptions(parts=3, method=slabs).method == slabs
    with pytest.raises(ValueError, match="is not one of"):
        RunOptions(parts=3, method="not_registered")


def test_registered_method_through_preprocess_workers(slabs, runs_src, tmp_path):
    """Workers are spawned processes: the parent's registration travels to them."""
    res = preprocess_runs(runs_src, tmp_path, parts=3, method=slabs, volume=False, workers=2)
    assert [r.status for r in res] == ["written", "written"], [r.message for r in res]
    attrs = zarr.open_group(str(tmp_path / "run_1.zarr"), mode="r").attrs
    assert attrs["surface"]["method"] == slabs


def test_a_lambda_cannot_reach_workers(runs_src, tmp_path):
    register_method("anon", lambda *a, **k: x_slabs(*a, **k))
    try:
        with pytest.raises(ValueError, match="cannot import"):
            preprocess_runs(runs_src, tmp_path, parts=2, method="anon", volume=False, workers=2)
    finally:
        registry._METHODS.pop("anon", None)


def test_entry_point_method_in_the_cli(tmp_path):
    """An installed package's entry point makes ``--method`` accept its name."""
    site = tmp_path / "site"
    dist = site / "slabpkg-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: slabpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[meshshard.partition_methods]\nx_slabs = tests.partition._methods_fns:x_slabs\n")
    pts = np.random.default_rng(1).random((60, 3)).astype(np.float32)
    np.save(tmp_path / "pts.npy", pts)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    cmd = [sys.executable, "-m", "meshshard", "partition", str(tmp_path / "pts.npy"),
           "--parts", "4", "--method", "x_slabs", "--out", str(tmp_path / "out"), "--no-progress"]
    got = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    meta = json.loads((tmp_path / "out" / "partition.json").read_text())
    assert meta["method"] == "x_slabs"
    helptext = subprocess.run([sys.executable, "-m", "meshshard", "partition", "--help"],
                              env=env, capture_output=True, text=True, timeout=300).stdout
    assert "x_slabs" in helptext
