"""The sharded signed distance field equals a single-process brute force (all pairs, sign by
the generalised winding number) on 2-4 gloo ranks, triangles and queries uneven with empty
shards; open surfaces warn and fall back to unsigned, or raise."""

from __future__ import annotations

import pytest
import torch

from meshshard.ops._triangles import closest_points
from meshshard.testing import RankCases, run_ranks
from tests.ops._sdf_fns import cube, nonfinite, queries, reference, sdf_cases, torus

CASES = RankCases(sdf_cases, {
    2: [
        {"mesh": "torus", "tri": [0, None], "queries": [40, 60], "grid": [2, 3]},
        {"mesh": "cube", "tri": [5, None], "queries": [0, 80], "shuffle": False},
        {"mesh": "bumpy", "tri": [300, None], "queries": [70, 30], "grid": [0, 5]},
        {"mesh": "torus", "tri": [100, None], "queries": [30, 30], "open": 3},
        {"mesh": "torus", "tri": [100, None], "queries": [5, 5], "open": 1, "on_open": "raise"},
    ],
    4: [
        {"mesh": "bumpy", "tri": [1, 0, 200, None], "queries": [25, 0, 40, 35],
         "grid": [1, 0, 3, 1]},
        {"mesh": "cube", "tri": [3, 3, 0, None], "queries": [10, 20, 30, 0], "nboxes": 1},
        {"mesh": "torus", "tri": [40, 0, 100, None], "queries": [0, 20, 10, 15],
         "grid": ([1, 4], [3, 0]), "grid_axis": (0, 1)},
    ],
}, timeout=240)


@pytest.mark.parametrize(("world", "i"), CASES.params())
def test_sdf_matches_brute_force(world, i):
    case, reports = CASES.case(world, i), CASES.per_rank(world, i)
    if case.get("on_open") == "raise":
        for rep in reports:
            assert "not closed" in rep["raised"] and "watertight" in rep["raised"]
        return
    for rank, rep in enumerate(reports):
        closed = not case.get("open")
        assert rep["closed"] is closed
        for key in ("sdf", "functional", "grid"):
            if key not in rep:
                continue
            got, want = rep[key]
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12,
                                       msg=lambda m, k=key, r=rank: f"rank {r} {k}: {m}")
            assert torch.equal(torch.sign(got), torch.sign(want)), f"rank {rank} {key}: signs"
        torch.testing.assert_close(*rep["grad"], rtol=1e-9, atol=1e-12)
        if closed:
            assert rep["warnings"] == []
        else:
            assert (rep["sdf"][0] >= 0).all()
            assert (len(rep["warnings"]) == 1) == (rank == 0)
            if rank == 0:
                assert "UNSIGNED" in rep["warnings"][0]
    if not case.get("open"):  # the cases have points inside and outside
        sdf = torch.cat([rep["sdf"][0] for rep in reports])
        assert (sdf < 0).sum() >= 3 and (sdf > 0).sum() >= 3


def test_reference_sign_is_inside_negative():
    t = cube()
    q = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 2.0], [0.1, 0.2, 0.45]], dtype=torch.float64)
    torch.testing.assert_close(reference(t, q), torch.tensor([-0.5, 1.5, -0.05],
                                                              dtype=torch.float64))


def test_closest_points_match_dense_sampling():
    tri = torus(6, 4)[:5]
    q = queries(7)
    pt, _ = closest_points(q.repeat_interleave(5, 0), tri.repeat(7, 1, 1))
    d = torch.linalg.vector_norm(q.repeat_interleave(5, 0) - pt, dim=-1)
    w = torch.rand(20000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w = w / w.sum(1, keepdim=True)
    samples = torch.einsum("sk,tkd->tsd", w, tri)  # (5, S, 3)
    dense = torch.cdist(q, samples.reshape(-1, 3)).reshape(7, 5, -1).min(-1).values.reshape(-1)
    assert (d <= dense + 1e-12).all() and (dense - d).max() < 0.02


@pytest.mark.parametrize("collide", [False, True])
def test_groups_are_exactly_the_equal_rows(monkeypatch, collide):
    from meshshard.ops import sdf

    g = torch.Generator().manual_seed(3)
    keys = torch.randint(-3, 3, (500, 4), generator=g)
    keys[::7] = keys[1::7][: keys[::7].shape[0]]  # many duplicates
    if collide:  # every row hashes alike: the check must see it and fall back
        monkeypatch.setattr(sdf, "_hash", lambda k: torch.zeros(k.shape[0], dtype=torch.int64))
    inv = sdf._groups(keys)
    _, want = torch.unique(keys, dim=0, return_inverse=True)
    same = inv[:, None] == inv[None]
    assert torch.equal(same, want[:, None] == want[None])


def test_nonfinite_triangles_and_queries_raise_on_every_rank():
    for rank, msgs in enumerate(run_ranks(nonfinite, 2, timeout=120)):
        assert len(msgs) == 2, msgs
        # the rank with the bad rows names them; the others name that rank
        tri_msg, q_msg = msgs
        assert ("1 triangles have NaN or inf" in tri_msg) if rank == 0 else (
            "invalid input on rank(s) [0]" in tri_msg)
        assert ("1 queries have NaN or inf" in q_msg) if rank == 1 else (
            "invalid input on rank(s) [1]" in q_msg)
