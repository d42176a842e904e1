"""Grid<->point ball query and kNN (meshshard.ops.gridpoint) and the sharded, N-D-mesh
grid_sample (meshshard.ops.gridsample) equal one process: brute force float64 and
F.grid_sample, forward and gradients, on uneven layouts with empty shards and one-row slabs."""

from __future__ import annotations

import pytest
import torch

from meshshard.ops.gridpoint import GridLayout
from meshshard.ops.gridsample import grid_sample
from meshshard.testing import RankCases, run_ranks
from tests.ops._gridpoint_fns import (
    ORIGIN,
    SHAPE,
    SPACING,
    grid_sample_cases,
    gridpoint_cases,
    radius_zero,
)

GP_CASES = RankCases(gridpoint_cases, {
    2: [
        {"points": [7, 13], "grid": [1, 4], "op": "radius", "r": 0.3,
         "direction": "grid_to_points"},
        {"points": [0, 20], "grid": [3, 2], "op": "radius", "r": 0.35,
         "direction": "points_to_grid"},
        {"points": [9, 11], "grid": [0, 5], "op": "knn", "k": 3, "direction": "grid_to_points"},
        {"points": [15, 0], "grid": [1, 4], "op": "knn", "k": 4, "direction": "points_to_grid"},
        {"points": [6, 14], "grid": [3, 1], "axis": 1, "op": "radius", "r": 0.3,
         "direction": "points_to_grid"},
        {"points": [6, 14], "grid": None, "op": "radius", "r": 0.3,
         "direction": "grid_to_points"},
        {"points": [6, 14], "grid": None, "op": "knn", "k": 2, "direction": "points_to_grid"},
    ],
    3: [
        {"points": [5, 0, 12], "grid": [2, 0, 3], "op": "radius", "r": 0.3,
         "direction": "grid_to_points"},
        {"points": [1, 10, 6], "grid": [1, 1, 1], "axis": 2, "op": "knn", "k": 3,
         "direction": "points_to_grid"},
        {"points": [4, 4, 9], "grid": [1, 3, 0], "axis": 1, "op": "knn", "k": 2,
         "direction": "grid_to_points"},
    ],
    # a 2x2 mesh: points and grid cut on mesh dim 0, replicated on mesh dim 1
    4: [
        {"mesh": (2, 2), "points": [0, 17], "grid": [2, 3], "op": "radius", "r": 0.3,
         "direction": "grid_to_points"},
        {"mesh": (2, 2), "points": [8, 9], "grid": [1, 3], "axis": 1, "op": "knn", "k": 3,
         "direction": "points_to_grid"},
        # the grid in blocks along two axes over all four ranks (as a 2x2 mesh numbers them),
        # the points over the same ranks: one-row, empty and whole-axis blocks
        {"points": [5, 0, 9, 6], "grid": ([1, 4], [3, 1]), "axis": (0, 1), "op": "radius",
         "r": 0.3, "direction": "grid_to_points"},
        {"points": [0, 7, 6, 8], "grid": ([2, 3], [4, 0]), "axis": (0, 1), "op": "radius",
         "r": 0.35, "direction": "points_to_grid"},
        {"points": [6, 6, 0, 9], "grid": ([3, 0], [1, 3]), "axis": (2, 1), "op": "knn",
         "k": 3, "direction": "grid_to_points"},
        {"points": [4, 9, 7, 0], "grid": ([0, 3], [3, 2]), "axis": (2, 0), "op": "knn",
         "k": 4, "direction": "points_to_grid"},
    ],
}, timeout=120)

# per mesh dim: None (grid replicated) or (spatial axis, sizes); route: the points' mesh dim
GS_CASES = {
    (2,): [{"grid": [(0, [1, 4])], "route": 0, "points": [0, 17]},
           {"grid": [None], "route": 0, "points": [6, 5]},
           {"grid": [(2, [2, 1])], "route": None, "points": [9]}],
    (3,): [{"grid": [(1, [2, 0, 2])], "route": 0, "points": [5, 0, 9]}],
    (2, 2): [{"grid": [(0, [2, 3]), (2, [1, 2])], "route": 0, "points": [6, 9]},
             {"grid": [None, (1, [3, 1])], "route": 0, "points": [0, 10]},
             {"grid": [(0, [4, 1]), None], "route": 1, "points": [7, 3]},
             {"grid": [(1, [1, 3]), (0, [0, 5])], "route": None, "points": [8]}],
}

_RES: dict = {}


def _gs(mesh):
    if mesh not in _RES:
        n = 1
        for s in mesh:
            n *= s
        _RES[mesh] = run_ranks(grid_sample_cases, n, list(mesh), GS_CASES[mesh], timeout=120)
    return _RES[mesh]


@pytest.mark.parametrize(("world", "i"), GP_CASES.params())
def test_grid_queries_match_brute_force(world, i):
    case = GP_CASES.case(world, i)
    for rank, rep in enumerate(GP_CASES.per_rank(world, i)):
        got, want = rep["index"]
        assert torch.equal(got, want), f"rank {rank}: neighbour indices differ ({case})"
        torch.testing.assert_close(*rep["dist"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(*rep["grad"], rtol=1e-10, atol=1e-12)
        if case["grid"] is not None and case["direction"] == "grid_to_points":
            lay = GridLayout(SHAPE, ORIGIN, SPACING, sizes=case["grid"], axis=case.get("axis", 0))
            assert list(rep["sizes"]) == lay.node_counts(lay.parts)


@pytest.mark.parametrize(("mesh", "i"), [(m, i) for m in GS_CASES for i in range(len(GS_CASES[m]))],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_grid_sample_matches_F_grid_sample(mesh, i):
    for rank, reports in enumerate(_gs(mesh)):
        for key, (got, want) in reports[i].items():
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12,
                                       msg=lambda m, k=key, r=rank: f"rank {r} {k}: {m}")


def test_grid_sample_plain_tensors_is_F_grid_sample():
    g = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    c = torch.rand(2, 7, 2, dtype=torch.float64) * 2 - 1
    want = torch.nn.functional.grid_sample(g, c[:, None], align_corners=True)[:, :, 0]
    torch.testing.assert_close(grid_sample(g, c, align_corners=True), want.transpose(1, 2))


def test_layout_normalize_matches_nodes():
    lay = GridLayout(SHAPE, ORIGIN, SPACING)
    nodes = lay.local_nodes(0, torch.float64)
    n = int(torch.tensor(SHAPE).prod())
    grid = torch.arange(float(n), dtype=torch.float64).reshape(1, 1, *SHAPE)
    for align in (True, False):
        c = lay.normalize(nodes, align_corners=align)[None]
        got = grid_sample(grid, c, align_corners=align, padding_mode="border")
        torch.testing.assert_close(got[0, :, 0], grid.reshape(-1))


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="spacing"):
        GridLayout(SHAPE, ORIGIN, (0.1, 0.0, 0.2))
    with pytest.raises(ValueError, match="sum to shape"):
        GridLayout(SHAPE, ORIGIN, SPACING, sizes=[2, 2])
    with pytest.raises(ValueError, match="padding_mode"):
        grid_sample(torch.zeros(1, 1, 2, 2, 2), torch.zeros(1, 1, 3), padding_mode="reflection")
    lay = GridLayout(SHAPE, ORIGIN, SPACING)
    with pytest.raises(ValueError, match="does not cover"):
        lay.check_covers(torch.tensor([[100.0, 0.0, 0.5]]))
    lay.check_covers(lay.local_nodes(0, torch.float64))
    with pytest.raises(ValueError, match="one sequence per cut axis"):
        GridLayout(SHAPE, ORIGIN, SPACING, sizes=[2, 3], axis=(0, 1))
    with pytest.raises(ValueError, match="distinct"):
        GridLayout(SHAPE, ORIGIN, SPACING, sizes=([2, 3], [5]), axis=(0, 0))
    with pytest.raises(ValueError, match="sum to shape"):
        GridLayout(SHAPE, ORIGIN, SPACING, sizes=([2, 3], [2, 1]), axis=(0, 1))
    with pytest.raises(ValueError, match="use block"):
        GridLayout(SHAPE, ORIGIN, SPACING, sizes=([2, 3], [2, 2]), axis=(0, 1)).rows(0)


@pytest.mark.parametrize(("sizes", "axis"), [(([1, 4], [3, 0, 1]), (0, 1)),
                                             (([2, 0, 1], [0, 5]), (2, 0)),
                                             (([1, 4], [2, 2], [1, 2]), (0, 1, 2))])
def test_blocks_tile_the_grid_in_row_major_rank_order(sizes, axis):
    lay = GridLayout(SHAPE, ORIGIN, SPACING, sizes=sizes, axis=axis)
    full = GridLayout(SHAPE, ORIGIN, SPACING)
    flat = torch.cat([full.flat(lay.local_index(r)) for r in range(lay.parts)])
    assert torch.equal(flat.sort().values, torch.arange(full.node_counts(1)[0]))
    coords = torch.cartesian_prod(*[torch.arange(len(c)) for c in sizes]).reshape(-1, len(sizes))
    for r, coord in enumerate(coords.tolist()):  # block r: coordinate r in row-major order
        idx = lay.local_index(r)
        for a, c, k in zip(axis, sizes, coord):
            lo = sum(c[:k])
            assert lay.local_shape(r)[a] == c[k]
            assert idx.numel() == 0 or (idx[:, a].min() >= lo and idx[:, a].max() < lo + c[k])


def test_radius_le_zero_raises():
    for msg in run_ranks(radius_zero, 2, timeout=120):
        assert "r=0.0 must be a finite number > 0" in msg
