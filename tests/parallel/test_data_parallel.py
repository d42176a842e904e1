"""DDP and FSDP2 over "data" with ShardTensor inputs over "domain" (2 x 2 mesh, uneven point
layouts (3, 5) and (1, 6)): outputs, weight gradients and Adam steps equal one process."""

import pytest
import torch

from meshshard.testing import RankError, run_ranks
from tests.parallel import _fns

STEPS = 3


@pytest.fixture(scope="module")
def reference():
    return _fns.reference(STEPS)


@pytest.mark.parametrize(
    ("mode", "shard_dims", "extra"),
    [("ddp", None, None), ("ddp", None, {"static_graph": True}), ("fsdp", None, None),
     ("fsdp", ("data",), None)],
    ids=["ddp", "ddp-static-graph", "fsdp-data-x-domain", "fsdp-data"],
)
def test_matches_single_process(mode, shard_dims, extra, reference):
    _check(reference, run_ranks(_fns.data_parallel_run, 4, mode, shard_dims, STEPS, extra,
                                timeout=120))


def test_fsdp_with_an_in_place_op_on_the_output_matches_single_process(reference):
    """Issue 26: FSDP2 warned once per rank that the model returned a view (an in-place op on
    it would drop the pre-backward hook: wrong gradients). The output is no view now; an
    in-place op on it gives the single-process gradients, and no warning."""
    _check(reference, run_ranks(_fns.data_parallel_run, 4, "fsdp", None, STEPS, None,
                                True, timeout=120))


def _check(reference, reports):
    ref, outs, grads, losses = reference
    weights = _fns.full_params(ref)
    for rank, rep in enumerate(reports):
        torch.testing.assert_close(rep["out"], outs[rep["group"]], rtol=1e-5, atol=1e-5)
        assert rep["grads"].keys() == grads.keys()
        for name, g in grads.items():
            assert rep["grads"][name] is not None, f"rank {rank}: gradient of {name} dropped"
            torch.testing.assert_close(rep["grads"][name], g, rtol=1e-4, atol=1e-6,
                                       msg=lambda m, n=name, r=rank: f"rank {r} grad {n}: {m}")
        assert rep["losses"] == pytest.approx(losses, rel=1e-5)
        assert not rep.get("view_warnings"), rep["view_warnings"]  # FSDP2: "wrong gradients"
        for name, w in weights.items():
            torch.testing.assert_close(rep["weights"][name], w, rtol=1e-4, atol=1e-6)


def test_bad_input_errors_on_every_rank():
    with pytest.raises(RankError) as info:
        run_ranks(_fns.bad_inputs, 4, timeout=120)
    assert sorted(info.value.failures) == [0, 1, 2, 3]
    for tb in info.value.failures.values():
        assert "the model's weights differ between ranks" in tb


def test_train_loop_buckets_weight_gradients_only_without_ddp_or_fsdp():
    """Under DDP/FSDP each weight's gradient accumulation is hooked by their reducers, which a
    deferred (bucketed) weight gradient would never reach."""
    assert run_ranks(_fns.bucket_guard, 1) == [(True, False, False)]
