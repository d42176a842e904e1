from __future__ import annotations

import numpy as np
import pytest

from meshshard.partition import (
    HaloPlan,
    halo_plan,
    halo_plan_graph,
    halo_plan_radius,
    knn_graph,
    partition,
)


def _ghost_sets(plan: HaloPlan, part) -> list[set[int]]:
    """Per shard: original rows of its ghosts, checking the plan's layout on the way."""
    plan.validate()
    out = []
    off = part.offsets
    for p in range(part.nparts):
        r = plan.recv_idx[p]
        assert np.all(np.diff(r) > 0)  # grouped by source shard, ascending stored rows
        for q in range(part.nparts):
            grp = r[plan.recv_ptr[p][q] : plan.recv_ptr[p][q + 1]]
            assert np.all((grp >= off[q]) & (grp < off[q + 1]))
        assert plan.recv_ptr[p][p + 1] == plan.recv_ptr[p][p]  # nothing from itself
        out.append(set(part.order[r].tolist()))
    return out


@pytest.mark.parametrize("method", ["rcb", "hilbert"])
def test_radius_halo_matches_brute_force(method):
    rng = np.random.default_rng(0)
    pts = np.concatenate([rng.random((300, 3)), 0.5 + 0.02 * rng.normal(size=(100, 3))])
    part = partition(pts, 4, method=method, targets=[0.4, 0.0, 0.3, 0.3])  # one empty shard
    r = 0.12
    plan = halo_plan_radius(part, pts, r)
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    got = _ghost_sets(plan, part)
    for p in range(4):
        inside = part.assignment == p
        want = np.flatnonzero((d[inside] <= r).any(axis=0) & ~inside) if inside.any() else []
        assert got[p] == set(np.asarray(want).tolist())
    assert plan.kind == "radius" and plan.halo_sizes()[1] == 0


def test_radius_is_inclusive_and_validated():
    pts = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    part = partition(pts, 2, method="rcb")
    plan = halo_plan_radius(part, pts, 1.0)
    assert plan.halo_sizes().tolist() == [1, 1]
    assert halo_plan_radius(part, pts, 0.999).halo_sizes().tolist() == [0, 0]
    with pytest.raises(ValueError, match="r=0 must be a finite radius > 0"):
        halo_plan_radius(part, pts, 0)
    with pytest.raises(ValueError, match="r=nan"):
        halo_plan_radius(part, pts, float("nan"))


@pytest.mark.parametrize("rings", [1, 2, 3])
def test_graph_halo_k_rings_match_bfs(rings, tmp_path):
    pts = np.random.default_rng(1).random((250, 2))
    g = knn_graph(pts, 4)
    part = partition(pts, 3, method="morton")
    plan = halo_plan_graph(part, g, rings=rings)
    got = _ghost_sets(plan, part)
    dense = g.toarray().astype(bool)
    for p in range(3):
        reach = part.assignment == p
        for _ in range(rings):
            reach = reach | dense[reach].any(axis=0)
        want = set(np.flatnonzero(reach & (part.assignment != p)).tolist())
        assert got[p] == want
    back = HaloPlan.load(plan.save(tmp_path / "h"))
    assert all(np.array_equal(a, b) for a, b in zip(back.recv_idx, plan.recv_idx))
    with pytest.raises(ValueError, match="rings=0 must be an int >= 1"):
        halo_plan_graph(part, g, rings=0)


def test_halo_plan_front_door():
    pts = np.random.default_rng(2).random((120, 3))
    part = partition(pts, 3)
    by_r = halo_plan(part, points=pts, r=0.15)
    assert by_r.kind == "radius"
    assert [a.tolist() for a in by_r.recv_idx] == [
        a.tolist() for a in halo_plan_radius(part, pts, 0.15).recv_idx
    ]
    assert halo_plan(part, graph=knn_graph(pts, 4), rings=2).params == {"rings": 2}
    with pytest.raises(ValueError, match="either graph="):
        halo_plan(part)
    with pytest.raises(ValueError, match="needs points="):
        halo_plan(part, r=0.1)
