"""How many collectives the rules run, and that fewer is still exact.

On gloo every all-reduce costs ~0.3-1 ms of CPU here, whatever its size, so at small point
counts a step's overhead is its number of collectives. A Partial that meets a product is reduced
at once, and a Partial read twice is reduced once (see ``rules._reduce_once``); the counts below
fail if either comes undone. Counts come from torch's profiler (gloo's own all-reduce events).
"""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _count_fns

TOL = dict(rtol=1e-12, atol=1e-12)  # float64: the sums differ from one process by rounding


def test_a_partial_read_twice_is_reduced_once_and_again_after_an_in_place_change():
    """Also: a Partial plus a number stays Partial, and one op's two Partials share one
    collective."""
    for rep in run_ranks(_count_fns.partial_memo, 2):
        assert rep["n_two"] == 1
        assert rep["n_after"] == 1
        assert rep["n_view"] == 1
        assert rep["n_pair"] == 1  # both operands of the division at once, then w's memo
        for got, want in rep["values"] + rep["pair"]:
            torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("bucket", [False, True])
def test_transolver_step_collectives_per_layer(bucket):
    layers = 2
    reps = run_ranks(_count_fns.transolver_step, 2, (3, 5), layers, False, bucket,
                     timeout=300)  # fmt: skip
    for rep in reps:
        # forward: slice weight sums and slice tokens together, once per layer (a lazy
        # Partial re-reduced the tokens in q, k and v: 4 per layer)
        assert rep["n_fwd"] == layers
        if bucket:  # per layer the tokens' gradient and the temperature (a clamp of the
            # parameter, summed where it is lifted); then one sum for all weight gradients
            assert rep["n_bwd"] == 2 * layers + 1
        else:  # one reduction of the tokens' gradient per layer, plus the weight gradients
            # (one per linear layer over the points, one per layer norm's weight and bias, one
            # per lifted plain parameter): never more than one per parameter tensor
            assert rep["n_bwd"] <= layers + rep["n_params"]
        torch.testing.assert_close(*rep["loss"], **TOL)
        for got, want in rep["grads"]:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert len({(r["n_fwd"], r["n_bwd"]) for r in reps}) == 1  # every rank alike


def test_compiled_transolver_sums_the_weight_gradients_in_one_collective():
    """Under plain ``torch.compile`` the weights' Partial gradients of the traced backward are
    summed in one flattened collective (``_aten/grad_bucket``), not one per layer: 5
    backward all-reduces for 2 layers (eager 25, or 5 inside ``bucket_weight_grads``), with
    one process's gradients."""
    layers = 2
    reps = run_ranks(_count_fns.transolver_step, 2, (3, 5), layers, True, timeout=300)
    for rep in reps:
        assert rep["n_fwd"] == layers
        # per layer: the tokens' gradient, and the temperature (a clamp of the parameter, not
        # a graph input: summed where it is lifted); then one sum for all weight gradients
        assert rep["n_bwd"] == 2 * layers + 1
        torch.testing.assert_close(*rep["loss"], **TOL)
        for got, want in rep["grads"]:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_compiled_weight_gradients_tied_plain_and_no_bias_on_uneven_layouts():
    """A tied linear, a linear without bias, a layer norm and a parameter used in a plain
    path too: compiled, and eager inside ``bucket_weight_grads``, one all-reduce for all
    weights plus one for the plain scalar lifted into the points (eager without it: 7),
    gradients equal one process's, also with an empty shard."""
    for world, layouts in ((2, [(3, 5), (0, 8)]), (3, [(1, 1, 6)])):
        for per_layout in run_ranks(_count_fns.weights_both, world, layouts, timeout=300):
            for sizes, (e, eb, c) in zip(layouts, per_layout):
                assert e["n_bwd"] == 7, sizes
                assert eb["n_bwd"] == 2, sizes
                assert c["n_bwd"] == 2, sizes
                for rep in (e, eb, c):
                    for got, want in rep["grads"]:
                        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_eager_bucket_keeps_grad_accumulation_hooks_and_inputs():
    """Eager, the weight-gradient bucket sums every weight's Partial gradient in one
    collective after the engine and adds it to ``.grad``: ``autograd.grad`` returns the global
    gradients (2 all-reduces; ``backward`` inside ``bucket_weight_grads`` too), two backwards
    accumulate, a tensor hook sees (and may change) the global gradient, a post-accumulate
    hook sees the final ``.grad``,
    ``backward(inputs=...)`` fills only those, a weight passed to ``autograd.grad`` twice gets
    its gradient twice. Against one process, (3, 5), (0, 8), (1, 1, 6)."""
    for world, layouts in ((2, [(3, 5), (0, 8)]), (3, [(1, 1, 6)])):
        for per_layout in run_ranks(_count_fns.eager_bucket_layouts, world, layouts,
                                    timeout=300):  # fmt: skip
            for sizes, rep in zip(layouts, per_layout):
                n, pairs = rep["grad"]
                assert n == 2 and rep["n_twice"] == 2, sizes
                assert rep["n_seen"] == (1, 1), sizes
                assert all(rep["untouched"]), sizes
                for key in ("twice", "hooked", "inputs", "same"):
                    pairs = pairs + rep[key]
                for got, want in pairs:
                    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
