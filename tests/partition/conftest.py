"""Fixtures of the ghost-row refinement tests (``test_refiners.py``, ``test_volrefine.py``,
``test_fastrefine.py``): a kNN cloud and a triangle mesh's dual graph. Test files that define
their own keep theirs."""

from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.partition import dual_graph, knn_graph


@pytest.fixture(scope="module")
def cloud():
    pts = np.random.default_rng(1).random((3000, 3))
    return pts, knn_graph(pts, 6)


@pytest.fixture(scope="module")
def trimesh():
    pts = np.random.default_rng(2).random((2500, 2))
    surf = pv.PolyData(np.c_[pts, np.zeros(len(pts))]).delaunay_2d()
    centres = np.asarray(surf.cell_centers().points)[:, :2]
    return centres, dual_graph(surf)
