"""Finite but extreme coordinates: a kd-tree whose squared distances overflow float64 returns
its "no neighbour" sentinel (index N); that index once reached a CSR matrix and scipy's
``a + a.T`` corrupted the heap ("double free or corruption", SIGABRT). The CLI runs in a
subprocess here, so a crash fails the test instead of killing pytest."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from meshshard.partition import knn_graph
from meshshard.partition._validation import check_distance_range, check_tree_indices

_SCRIPT = """
import sys
from meshshard.cli import main
for method in ("metis", "hilbert"):
    code = main(["partition", sys.argv[1], "--parts", "4", "--method", method, "--out",
                 sys.argv[2] + method, "--no-progress"])
    print("exit", method, code, flush=True)
"""


def test_huge_coordinates_exit_2_naming_the_file(tmp_path):
    pytest.importorskip("pymetis")
    pts = np.random.default_rng(0).random((500, 3)) * 1e300
    f = tmp_path / "huge.npy"
    np.save(f, pts)
    # one subprocess for both methods (each aborted with SIGABRT before)
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(f), str(tmp_path / "out-")],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])
    assert r.stdout.split() == ["exit", "metis", "2", "exit", "hilbert", "2"], r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2, r.stderr
    for line in lines:
        assert "huge.npy" in line and "overflow" in line and "rescale" in line, line


def test_knn_graph_refuses_overflowing_and_underflowing_extents():
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="overflow float64"):
        knn_graph(rng.random((50, 3)) * 1e200, k=4)
    with pytest.raises(ValueError, match="underflow float64"):
        knn_graph(rng.random((50, 3)) * 1e-160, k=4)
    # the edges of the range stay usable: extent 1e150 and 1e-140 give the same graph as 1
    base = rng.random((200, 3))
    g = knn_graph(base, k=4)
    for s in (1e150, 1e-140):
        assert (knn_graph(base * s, k=4) != g).nnz == 0
    check_distance_range(np.zeros((3, 3)))  # all points equal: extent 0 is legal (ties)


def test_kdtree_sentinel_never_reaches_a_graph():
    idx = np.array([[0, 1], [1, 5]])  # 5 == N: cKDTree's "none found"
    with pytest.raises(ValueError, match="no neighbour for 1 query slot"):
        check_tree_indices(idx, 5)
    assert check_tree_indices(idx, 6) is idx
