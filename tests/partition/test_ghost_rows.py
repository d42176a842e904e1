"""Ghost rows per refresh depth (1-ring, 2-ring, a halo plan's k) against a brute-force count,
for every registered partitioning method (the optional ones when installed)."""

from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.partition import (
    dual_graph,
    ghost_rows,
    halo_plan_graph,
    halo_plan_radius,
    knn_graph,
    list_methods,
    metrics,
    partition,
)
from meshshard.partition.report import format_report, report


def _brute_ghosts(g, a: np.ndarray, depth: int) -> int:
    """Sum over shards of the outside vertices within ``depth`` hops, from a dense
    reachability matrix ((I + A)^depth > 0): the definition, with no BFS shared with the code."""
    n = g.shape[0]
    step = (g.toarray() != 0).astype(np.int64) + np.eye(n, dtype=np.int64)
    reach = np.eye(n, dtype=np.int64)
    for _ in range(depth):
        reach = ((reach @ step) > 0).astype(np.int64)
    total = 0
    for p in np.unique(a):
        near = reach[a == p].any(axis=0)
        total += int((near & (a != p)).sum())
    return total


def _methods() -> list[str]:
    """Every registered method; the optional ones only where their package imports."""
    from meshshard.partition.hypergraph import WITH_MTKAHYPAR
    from meshshard.partition.kaminpar_part import WITH_KAMINPAR

    missing = {"kaminpar": not WITH_KAMINPAR, "hypergraph": not WITH_MTKAHYPAR}
    return [m for m in list_methods() if not missing.get(m, False)]


@pytest.fixture(scope="module")
def meshes():
    """A small 2-D triangle mesh (dual graph) and a small kNN point cloud, 200-400 rows."""
    rng = np.random.default_rng(5)
    pts = rng.random((170, 2))
    surf = pv.PolyData(np.c_[pts, np.zeros(len(pts))]).delaunay_2d()
    centres = np.asarray(surf.cell_centers().points)
    cloud = rng.random((260, 3))
    return {"tri": (centres, dual_graph(surf)), "knn": (cloud, knn_graph(cloud, 6))}


@pytest.mark.parametrize("method", _methods())
@pytest.mark.parametrize("kind", ["tri", "knn"])
@pytest.mark.parametrize("targets", [None, [0.3, 0.5, 0.2], [0.0, 0.6, 0.0, 0.4]])
def test_reported_ghost_rows_equal_brute_force(meshes, method, kind, targets):
    pts, g = meshes[kind]
    parts = 3 if targets is None else len(targets)
    extra = {"graph": g} if method in ("metis", "kaminpar", "hypergraph") else {}
    p = partition(pts, parts, method=method, targets=targets, **extra)
    plan = halo_plan_graph(p, g, rings=3)
    m = metrics(p, graph=g, depths=(1, 2), plan=plan)
    want = {str(d): _brute_ghosts(g, p.assignment, d) for d in (1, 2, 3)}
    assert m["ghost_rows"] == want
    assert m["ghost_rows"]["1"] == m["halo_volume"] == m["comm_volume"]
    assert m["ghost_rows_plan"] == want["3"]
    assert want["1"] < want["2"] < want["3"]
    if targets is not None and 0.0 in targets:
        assert p.sizes[0] == 0 and p.sizes[2] == 0


def test_ghost_rows_function_plan_and_report(meshes):
    pts, g = meshes["knn"]
    p = partition(pts, 4, method="rcb")
    rows = ghost_rows(p, g, rings=3)
    assert rows == [_brute_ghosts(g, p.assignment, d) for d in (1, 2, 3)]
    assert rows == [int(halo_plan_graph(p, g, d).halo_sizes().sum()) for d in (1, 2, 3)]
    # a radius plan's ghost rows are reported as they are; depths stay the asked ones
    rp = halo_plan_radius(p, pts, 0.15)
    m = metrics(p, graph=g, depths=[2], plan=rp)
    assert m["ghost_rows"] == {"2": rows[1]}
    assert m["ghost_rows_plan"] == int(rp.halo_sizes().sum())
    text = format_report(report(p, graph=g, plan=halo_plan_graph(p, g, 3)))
    assert f"3-ring {rows[2]:,}" in text and f"2-ring {rows[1]:,}" in text
    assert "ghost rows of the halo plan (kind=graph, rings=3)" in text


def test_ghost_rows_bad_input(meshes):
    pts, g = meshes["knn"]
    p = partition(pts, 2)
    with pytest.raises(ValueError, match="depth must be an int >= 1"):
        metrics(p, graph=g, depths=(0,))
    with pytest.raises(ValueError, match="rings=0 must be an int >= 1"):
        ghost_rows(p, g, rings=0)
    other = partition(pts, 3)
    with pytest.raises(ValueError, match="plan is for 3 shards"):
        metrics(p, graph=g, plan=halo_plan_graph(other, g, 1))
    # no graph: no ghost rows, but a plan's own count is still reported
    m = metrics(p, plan=halo_plan_graph(p, g, 2))
    assert "ghost_rows" not in m and m["ghost_rows_plan"] > 0
