"""Bad input raises a clear error on every rank (bad data on one rank must not hang the rest)."""

from __future__ import annotations

import pytest

from meshshard.testing.distributed import run_ranks
from tests.ops._fns import bad_inputs

EXPECT = {
    "k0": ["k=0 must be >= 1"],
    "k_too_big": ["k=100", "11 point(s)", "use k <= 11"],
    "k_loop_false": ["k=11", "loop=False", "use k <= 10"],
    "nan_one_rank": ["2 NaN/inf", "{1: 2}"],
    "int_one_rank": ["integer", "rank(s) 0", "x.float()"],
    "3d_one_rank": ["shape (n, d)", "[1]", "reshape"],
    "dim_mismatch_y": ["x has 3 coordinates per point but y has 2"],
    "dim_across_ranks": ["different feature dims", "[3, 2]"],
    "k_differs": ["differ across ranks", "[2, 3]"],
    "r_zero": ["r=0.0 must be a finite number > 0"],
    "r_nan": ["r=nan"],
    "y_nan": ["y holds 2 NaN/inf"],
    "dtype_xy": ["torch.float64", "torch.float32"],
    "x_sizes_wrong": ["x_sizes=[5, 5]", "[5, 6]"],
    "gather_out_of_range": ["rank 1", "[0, 50]", "0..10"],
    "gather_float_index": ["integer tensor", ".long()"],
    "backend": ["'faiss'", "kdtree"],
    "nboxes": ["nboxes=0 must be an int >= 1"],
    "format": ["format='coo'", "'padded' or 'csr'"],
    "cap": ["max_num_neighbors=0", "None or an int >= 1"],
    "flow": ["flow='up'", "source_to_target"],
    "halo_rows": ["halo_exchange"],
    "halo_parts": ["3 shards but the group has 2 ranks"],
    "scatter_reduce": ["reduce='min'", "'sum', 'mean', 'max'"],
    "grad_one_rank": ["requires_grad", "[1, 0]", "same way on every rank"],
}


@pytest.fixture(scope="module")
def outcome():
    return run_ranks(bad_inputs, 2, timeout=60)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_error_on_every_rank(outcome, name: str) -> None:
    for rank, res in enumerate(outcome):
        msg = res[name]
        assert msg is not None, f"{name}: rank {rank} did not raise"
        # per-rank problems (halo/gather/scatter) are detailed on the rank that found them;
        # the other ranks say which rank failed
        expect = EXPECT[name]
        if name == "gather_out_of_range" and rank == 0:
            expect = ["invalid input on rank(s) [1]"]
        if name == "halo_rows":
            expect = (
                ["rank 1 holds (2, 3) but the plan expects 6 rows"]
                if rank == 1
                else ["invalid input on rank(s) [1]"]
            )
        for part in expect:
            assert part in msg, f"{name} on rank {rank}: {part!r} not in {msg!r}"


def test_group_still_usable_after_errors(outcome) -> None:
    for res in outcome:
        assert res["still_in_sync"] == 2.0
        assert tuple(res["good_after"]) == (5 + outcome.index(res), 3)
