import pytest

from meshshard.testing import RankError, run_ranks
from tests.testing import _fns


@pytest.mark.parametrize("world_size", [2, 4])
def test_allreduce_real_ranks(world_size):
    out = run_ranks(_fns.allreduce_rank, world_size)
    expected = world_size * (world_size + 1) / 2
    assert out == [expected] * world_size


def test_args_and_rank_order():
    out = run_ranks(_fns.echo_args, 2, 7, "x")
    assert out == [(0, 2, 7, "x"), (1, 2, 7, "x")]


def test_uneven_all_to_all_on_gloo():
    out = run_ranks(_fns.uneven_all_to_all, 2)
    # rank 0 receives 1 value from rank 0 (tag 0) and 2 values from rank 1 (tag 10)
    assert out[0] == [0.0, 10.0, 10.0]
    assert out[1] == [1.0, 1.0, 11.0, 11.0, 11.0]


def test_failure_reports_traceback_and_does_not_hang():
    with pytest.raises(RankError) as info:
        run_ranks(_fns.fail_on_rank_one, 2, timeout=600)
    assert "deliberate failure on rank 1" in info.value.failures[1]
    assert "rank 1" in str(info.value)
    # rank 0 was blocked in a collective: it fails (peer gone) or is stopped once rank 1
    # failed; it is not left waiting for the 600 s timeout
    assert "timed out" not in info.value.failures[0]


def test_hung_rank_times_out():
    with pytest.raises(RankError, match="timed out"):
        run_ranks(_fns.hang, 2, timeout=8)


def test_rank_that_dies_is_reported():
    with pytest.raises(RankError, match="exited with code 3"):
        run_ranks(_fns.hard_exit, 2, timeout=60)


def test_world_size_must_be_positive():
    with pytest.raises(ValueError, match="world_size=0"):
        run_ranks(_fns.allreduce_rank, 0)
