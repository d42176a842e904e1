"""Diverging ranks: the debug mode names the rank and both calls; without it, a collective
timeout ends every rank with an error instead of a hang."""

import pytest

from meshshard.comm.process import DEBUG_ENV, check_collective, debug_enabled, set_debug
from meshshard.testing import RankError, run_ranks
from tests import _diverge_fns


@pytest.fixture(scope="module", params=["today", "core"])
def debug_run(request):
    # "core": the aten-level ShardTensor of issue 22, whose collectives make the same checks
    return run_ranks(_diverge_fns.debug_cases, 3, request.param == "core",
                     env={DEBUG_ENV: "1"}, collective_timeout=60)


def test_rank0_only_item_is_named_on_every_rank(debug_run):
    for rank, out in enumerate(debug_run):
        assert out["debug"]
        seen = out["item_vs_gather"]
        assert seen is not None, f"rank {rank} saw no mismatch"
        assert seen["differing"] == [0]
        msg = seen["message"]
        assert f"collective mismatch on rank {rank}" in msg
        assert "rank(s) [0] differ from rank(s) [1, 2]" in msg
        # both calls: what, and where
        assert "rank(s) [0]: all_reduce(sum) float32[] at _diverge_fns.py:" in msg
        assert "in only_rank0_item" in msg
        assert "rank(s) [1, 2]: all_gather(uneven rows) float32[5, 2] at _diverge_fns.py:" in msg
        assert "in everyone_gathers" in msg


def test_same_collective_from_another_line_is_a_mismatch(debug_run):
    for out in debug_run:
        seen = out["same_op_other_line"]
        assert seen is not None and seen["differing"] == [0]
        calls = seen["calls"]
        assert "in only_rank0_item" in calls[0]
        assert "in other_item" in calls[1] and "in other_item" in calls[2]


def test_grid_halo_all_to_all_is_checked(debug_run):
    import torch

    for rank, out in enumerate(debug_run):
        seen = out["halo_vs_gather"]
        assert seen is not None, f"rank {rank} saw no mismatch"
        assert seen["differing"] == [0]
        msg = seen["message"]
        assert "rank(s) [0]: all_to_all_single(grid halo) float32[*, 1, 1, 2] at " in msg
        assert "in halo_conv" in msg
        assert "rank(s) [1, 2]: all_gather(uneven rows)" in msg and "in everyone_gathers" in msg
        got, want, grad, want_grad = out["halo_matching"]
        torch.testing.assert_close(got, want)  # float32, default tolerances
        torch.testing.assert_close(grad, want_grad)


def test_matching_calls_pass_and_stay_exact_after_a_mismatch(debug_run):
    import torch

    sizes = [3, 4, 5]
    full = torch.cat([torch.arange(n * 2.0).reshape(-1, 2) + r for r, n in enumerate(sizes)])
    for out in debug_run:
        assert out["full"] == full.tolist()
        assert out["loss"] == pytest.approx(float((full**2).sum()))
        assert out["grad"] == pytest.approx(full.sum(dim=0).tolist())  # backward collective
        assert out["check_alone_when_matching"] is None


def test_debug_off_makes_no_communication():
    assert run_ranks(_diverge_fns.debug_off_is_local, 2, env={DEBUG_ENV: "0"}) == [3.0, 3.0]


def test_rank0_only_item_without_debug_ends_every_rank_with_an_error():
    """No debug mode: the collective timeout (3 s here) ends the wait; every rank raises,
    none is left running until the harness' 300 s limit."""
    with pytest.raises(RankError) as info:
        run_ranks(_diverge_fns.item_on_rank0_only, 2, timeout=300, collective_timeout=3)
    err = info.value
    assert err.status == {0: "raised", 1: "raised"}, str(err)
    assert "Timed out waiting 3000ms" in str(err)  # gloo names the timeout it was given
    for text in err.failures.values():
        assert "RuntimeError" in text and "still running" not in text


def test_set_debug_switches_in_process(monkeypatch):
    before = debug_enabled()
    try:
        monkeypatch.setenv(DEBUG_ENV, "1")
        set_debug(None)
        assert debug_enabled()
        set_debug(False)
        assert not debug_enabled()
        check_collective("all_reduce")  # off: returns at once, nothing initialised needed
        set_debug(True)
        check_collective("all_reduce")  # on, but no process group: nothing to agree with
    finally:
        set_debug(before)
