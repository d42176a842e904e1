"""Bad input to the grid rules: a clear error on every rank, and the ranks stay in step."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor._grid_error_fns import bad_inputs

# by the class the error is (or derives from): {case: what its message says}
RAISES = {
    "HaloError": {"halo_beyond_neighbours": "max_hops=1"},
    "LayoutError": {"conv_channel_sharded": "channel dim",
                    "mismatched_meshes": "different DeviceMeshes"},
    "NotImplementedError": {"adaptive_not_dividing": "does not divide",
                            "interpolate_bicubic": "bicubic"},
    # torch's own checks, on the global shapes
    "RuntimeError": {"reflect_pad_too_large": "Padding size should be less than",
                     "circular_pad_wraps_twice": "wrapping around more than once",
                     "negative_pad_too_large": "negative output size",
                     "kernel_larger_than_grid": "can't be greater than actual input size",
                     "conv_channels_mismatch": "to have 3 channels, but got 2 channels",
                     "pool_larger_than_grid": "Output size is too small",
                     "pool_pad_too_large": "pad should be at most half"},
}
EXPECT = {case: (kind, text) for kind, cases in RAISES.items() for case, text in cases.items()}


@pytest.fixture(scope="module")
def reports():
    return run_ranks(bad_inputs, 4, (1, 1, 1, 5), timeout=300)


@pytest.mark.parametrize("case", list(EXPECT))
def test_error_on_every_rank(reports, case):
    kind, fragment = EXPECT[case]
    for rank, rep in enumerate(reports):
        assert rep[case] is not None, f"rank {rank}: {case} did not raise"
        kinds, msg = rep[case]
        assert kind in kinds, f"rank {rank}: {kinds[0]}: {msg}"
        assert fragment in msg, f"rank {rank}: {msg}"


def test_without_limit_thin_shards_are_exact(reports):
    assert all(rep["no_limit_exact"] for rep in reports)


def test_max_pool_indices_are_one_process_indices(reports):
    # design A refused return_indices on a sharded grid; the aten rules return the global
    # flat indices, as one process does
    for rep in reports:
        got, want, idx, want_idx = rep["max_pool_indices"]
        assert torch.equal(got, want)
        assert torch.equal(idx, want_idx)


def test_halo_bytes_are_the_rows_that_cross(reports):
    # layout (1, 1, 1, 5), rows of 1 x 2 x 6 float32 = 48 bytes: the two middle ranks send a
    # row to each neighbour, the outer ones to one; backward sends the same rows' gradients
    row = 48
    want = [row, 2 * row, 2 * row, row]
    assert [rep["halo_bytes"] for rep in reports] == [(w, w) for w in want]
