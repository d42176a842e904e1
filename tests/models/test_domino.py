"""DoMINO on 2-4 gloo ranks (points sharded uneven with an empty shard; the grid replicated,
cut in slabs along D, or in blocks along D and H on a 2x2 mesh, one-row and empty slabs)
equals one process: outputs, loss and every parameter gradient (float64 to 1e-9, float32 to
1e-4), given each rank's local tensors (gradients summed by allreduce_grads) or ShardTensors
("st": a ShardTensor loss and a plain backward, no user call), with the exact forwarded search
or the static-shape gathered one ("search": "gathered")."""

from __future__ import annotations

import pytest
import torch

from meshshard.models.domino import DoMINO
from meshshard.testing import RankCases, run_ranks
from tests.models._domino_fns import data, mismatched, model, reference, sharded, uncovered

CASES = RankCases(sharded, {
    2: [
        {"stl": [50, 70], "points": [0, 40], "grid": [1, 5]},
        {"stl": [0, 90], "points": [22, 18], "grid": None, "k": 10},
        {"stl": [60, 60], "points": [25, 15], "grid": [4, 2], "dtype": torch.float32},
        {"stl": [50, 70], "points": [0, 40], "grid": [1, 5], "st": True},
        {"stl": [40, 80], "points": [30, 10], "grid": None, "st": True},
        # the static-shape search (points, features and grid all-gathered): the same answers
        {"stl": [50, 70], "points": [0, 40], "grid": [1, 5], "st": True, "search": "gathered",
         "backend": "brute"},
        {"stl": [60, 60], "points": [25, 15], "grid": [4, 2], "dtype": torch.float32,
         "search": "gathered"},
    ],
    3: [
        {"stl": [10, 0, 80], "points": [10, 0, 30], "grid": [2, 0, 4]},
        {"stl": [30, 30, 30], "points": [5, 20, 15], "grid": [1, 1, 4], "k": 10},
        {"stl": [10, 0, 80], "points": [10, 0, 30], "grid": [2, 0, 4], "st": True},
        {"stl": [30, 30, 30], "points": [15, 25, 0], "grid": [1, 4, 1], "st": True,
         "dtype": torch.float32},
        {"stl": [10, 0, 80], "points": [10, 0, 30], "grid": [2, 0, 4], "st": True, "k": 10,
         "search": "gathered", "backend": "brute"},
    ],
    # a 2x2 mesh: the grid in blocks along D (mesh dim 0) and H (mesh dim 1), the points over
    # all four ranks; one-row blocks, an empty H column, an empty point shard
    4: [
        {"mesh": (2, 2), "stl": [30, 0, 40, 20], "points": [12, 0, 20, 8],
         "grid": ([1, 5], [3, 1])},
        {"mesh": (2, 2), "stl": [20, 25, 25, 20], "points": [10, 10, 0, 20],
         "grid": ([4, 2], [4, 0]), "k": 10},
        {"mesh": (2, 2), "stl": [25, 25, 25, 25], "points": [10, 10, 10, 10],
         "grid": ([3, 3], [1, 3]), "dtype": torch.float32},
        {"mesh": (2, 2), "stl": [30, 0, 40, 20], "points": [12, 0, 20, 8],
         "grid": ([1, 5], [3, 1]), "st": True},
        {"mesh": (2, 2), "stl": [20, 25, 25, 20], "points": [10, 10, 0, 20],
         "grid": ([4, 2], [4, 0]), "k": 10, "st": True},
        {"mesh": (2, 2), "stl": [30, 0, 40, 20], "points": [12, 0, 20, 8],
         "grid": ([1, 5], [3, 1]), "st": True, "search": "gathered", "backend": "brute"},
    ],
}, timeout=300)


@pytest.mark.parametrize(("world", "i"), CASES.params())
def test_domino_sharded_equals_one_process(world, i):
    case = CASES.case(world, i)
    dtype = case.get("dtype", torch.float64)
    tol = {"rtol": 1e-9, "atol": 1e-11} if dtype == torch.float64 else {"rtol": 1e-4,
                                                                         "atol": 1e-6}
    out, loss, grads, input_grads = reference(case, dtype)
    reports = CASES.per_rank(world, i)
    torch.testing.assert_close(torch.cat([r["out"] for r in reports]), out, **tol)
    for rep in reports:
        torch.testing.assert_close(rep["loss"], loss, **tol)
        assert rep["grads"].keys() == grads.keys()
        for name, g in grads.items():
            assert g.abs().max() > 0, f"{name}: zero gradient in the reference"
            torch.testing.assert_close(rep["grads"][name], g, **tol,
                                       msg=lambda m, n=name: f"{n}: {m}")
    if case.get("st"):  # the inputs' gradients: this rank's rows of one process's
        for key, g in input_grads.items():
            got = torch.cat([r["inputs_grad"][key] for r in reports])
            assert g.abs().max() > 0, f"{key}: zero gradient in the reference"
            torch.testing.assert_close(got, g, **tol, msg=lambda m, k=key: f"d/d {k}: {m}")
    for rep in reports:
        if case.get("st"):  # no user call: each backward sums its partials exactly once
            assert "summed over the ranks already" in rep["refused"], rep["refused"]
            assert torch.equal(*rep["no_grad"])
            for key, times in (("twice", 2), ("autograd_grad", 1), ("thrice", 3)):
                for name, g in grads.items():
                    torch.testing.assert_close(rep[key][name], times * g, **tol,
                                               msg=lambda m, n=name, k=key: f"{k} {n}: {m}")


def test_domino_rejects_mismatched_shardtensor_inputs():
    for msg in run_ranks(mismatched, 2, timeout=120):
        assert "is cut [3, 3] along D, the ops' grid_sizes are [1, 5]" in msg[0]
        assert "the grid is replicated here" in msg[1]
        assert "points is a local tensor but the other inputs are ShardTensors" in msg[2]


def test_domino_rejects_points_outside_the_grid():
    for msg in run_ranks(uncovered, 2, timeout=120):
        assert "does not cover the sampled points" in msg and "on ranks [1]" in msg
    stl, pts, sdf, feat, _ = data(20, 10, torch.float64)
    pts[3, 2] = -1.0
    with pytest.raises(ValueError, match="does not cover the sampled points: 1 lie outside"):
        model(torch.float64)(stl, sdf, pts, feat)


def test_domino_rejects_bad_radii():
    with pytest.raises(ValueError, match="must be > 0"):
        DoMINO(radii=(0.0, 0.2))
    with pytest.raises(ValueError, match="pair up"):
        DoMINO(radii=(0.1,), neighbors=(4, 8))


def test_cpu_conv_as_2d_rows_equals_conv3d():
    """The processor's CPU path (three batched 2-D convs) is the 3-D conv, forward and
    backward, on slabs from one row to many (float64: the rounding floor is ~1e-16)."""
    from meshshard.models.domino import _conv

    torch.manual_seed(0)
    conv = torch.nn.Conv3d(3, 5, 3).double()
    for d in (1, 2, 7):
        x = torch.randn(3, d + 2, 4, 6, dtype=torch.float64, requires_grad=True)
        want = conv(x)
        gw = torch.autograd.grad(want.square().sum(), [x, conv.weight, conv.bias])
        got = _conv(conv, x)
        gg = torch.autograd.grad(got.square().sum(), [x, conv.weight, conv.bias])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for a, b in zip(gg, gw):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
