from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from meshshard.partition import partition
from meshshard.partition._validation import check_graph

PTS = np.random.default_rng(0).random((50, 3))


@pytest.mark.parametrize("method", ["morton", "hilbert", "rcb"])
def test_nan_and_inf_coordinates_are_counted_and_located(method):
    pts = PTS.copy()
    pts[7, 1] = np.nan
    pts[9, 0] = np.inf
    with pytest.raises(ValueError, match=r"2 row\(s\) with NaN or inf.*first at row 7"):
        partition(pts, 2, method=method)


@pytest.mark.parametrize(
    "pts,match",
    [
        (np.zeros((5, 4)), r"shape \(N, 3\) or \(N, 2\), got \(5, 4\)"),
        (np.zeros(6), r"got \(6,\)"),
    ],
)
def test_wrong_shape(pts, match):
    with pytest.raises(ValueError, match=match):
        partition(pts, 2)


def test_wrong_dtype():
    with pytest.raises(TypeError, match="must hold real numbers, got dtype <U1"):
        partition(np.array([["a", "b", "c"]]), 1)


def test_parts():
    with pytest.raises(ValueError, match="parts=0 must be >= 1"):
        partition(PTS, 0)
    with pytest.raises(TypeError, match="parts must be an int"):
        partition(PTS, 2.5)
    with pytest.raises(ValueError, match="only 3 point.*parts=5.*allow_empty=True"):
        partition(PTS[:3], 5)


def test_weights():
    w = np.ones(50)
    w[4] = -1
    with pytest.raises(ValueError, match=r"1 negative, NaN or inf value\(s\) \(first at row 4"):
        partition(PTS, 2, weights=w)
    w[4] = np.nan
    with pytest.raises(ValueError, match="first at row 4: nan"):
        partition(PTS, 2, method="rcb", weights=w)
    with pytest.raises(ValueError, match=r"shape \(50,\)"):
        partition(PTS, 2, weights=np.ones(49))
    with pytest.raises(ValueError, match="all zero"):
        partition(PTS, 2, weights=np.zeros(50))


def test_targets():
    with pytest.raises(ValueError, match="must sum to 1, got 0.9"):
        partition(PTS, 2, targets=[0.5, 0.4])
    with pytest.raises(ValueError, match=">= 0"):
        partition(PTS, 2, targets=[1.5, -0.5])
    with pytest.raises(ValueError, match=r"one fraction per part \(3\)"):
        partition(PTS, 3, targets=[0.5, 0.5])


def test_unknown_method():
    with pytest.raises(ValueError, match="unknown method 'kmeans'; choose one of .*hilbert"):
        partition(PTS, 2, method="kmeans")


def test_graph_checks():
    a = sp.csr_matrix(np.array([[0, 1, 0], [0, 0, 1], [0, 1, 0]]))
    with pytest.raises(ValueError, match=r"not symmetric .*\(0, 1\)"):
        check_graph(a)
    b = sp.csr_matrix(np.array([[1, 1], [1, 0]]))
    with pytest.raises(ValueError, match=r"1 self loop\(s\) \(first at vertex 0\)"):
        check_graph(b)
    with pytest.raises(ValueError, match="3 vertices but there are 4 points"):
        check_graph(sp.csr_matrix((3, 3)), 4)
    with pytest.raises(TypeError, match="scipy.sparse matrix"):
        check_graph([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="square"):
        check_graph(sp.csr_matrix((3, 4)))
