"""Plain ``torch.compile(model)`` on 3 and 4 gloo ranks with an empty shard: the
reference Transolver, the grid UNet and MeshGraphNet, each compiled (aot_eager) against the
same model eager, whose equality with one process the oracle tests of each model check on
the same layouts (``test_autograd``, ``test_grid_conv``, ``test_graph_rows``). Under compile
the traced backward sums the weight gradients in one collective (``_aten/grad_bucket``); on
the rank with the empty shard its pieces are constants, so this also checks that every rank
still runs the same collectives in the same order.
"""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.graph._data import empty_and_isolated, first_empty
from tests.shardtensor import _graph_rows_fns, _grid_conv_fns, _training_fns

CASES = {
    3: {"transolver": (7, 0, 13), "unet": (1, 0, 7),
        "mgn": {"graph": "two", "n": 50, "method": "hand", "assign": empty_and_isolated}},
    4: {"transolver": (1, 1, 6, 0), "unet": (1, 1, 6, 0),
        "mgn": {"graph": "knn", "n": 60, "method": "hand", "assign": first_empty}},
}


def _compiled(rank, world, case):
    return {"transolver": _training_fns.compile_case(rank, world, [case["transolver"]]),
            "unet": _grid_conv_fns.compile_case(rank, world, [case["unet"]]),
            "mgn": _graph_rows_fns.compile_case(rank, world, case["mgn"])}


def _close(got, want, what, rtol, scale=0.0):
    atol = rtol * max(float(want.abs().max()) if want.numel() else 0.0, scale)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("world", sorted(CASES))
def test_plain_torch_compile_with_an_empty_shard_equals_eager(world):
    reports = run_ranks(_compiled, world, CASES[world], timeout=600)
    for rank, rep in enumerate(reports):
        # fp32 (Transolver): aot_eager runs the same aten ops unfused, equal up to rounding;
        # fp64 (UNet, MeshGraphNet): 1e-10 as in their oracle tests
        for model, rtol in (("transolver", 1e-6), ("unet", 1e-10)):
            r = rep[model]
            assert r["graph breaks"] == 0, (model, r.get("break reasons"))
            assert r["compiles"] == 1, (model, r["compiles"])
            pair = r["per layout"][0]
            # a gradient that is zero in exact arithmetic (a bias before a norm) is rounding
            # noise in both: judged against the step's largest output, as the oracles do
            scale = max(float(t.abs().max()) for t in pair["eager"] if t.numel())
            for k, (got, want) in enumerate(zip(pair["compiled"], pair["eager"])):
                _close(got, want, f"{model} rank {rank} output {k}", rtol, scale)
        mgn = rep["mgn"]
        assert mgn["graph breaks"] == 0
        for k, (got, want) in enumerate(zip(mgn["compiled"], mgn["eager"])):
            _close(got, want, f"mgn rank {rank} tensor {k}", 1e-10)


@pytest.mark.parametrize(("world", "sizes"), [(2, (0, 8)), (4, (1, 1, 6, 0))])
def test_compiled_activation_checkpointing_equals_one_process(world, sizes):
    """Each Transolver block under ``torch.utils.checkpoint`` inside ``torch.compile``: the
    blocks' collectives are effectful ops, which the partitioner must not recompute in the
    backward (it then saved their effect token as None and the compiled forward failed)."""
    for rank, rep in enumerate(run_ranks(_training_fns.compiled_checkpoint_case, world, sizes,
                                         timeout=600)):
        # fp64 (differences from one process are rounding, ~1e-15 relative); a gradient that
        # is zero in exact arithmetic is judged against the step's largest one
        scale = max(float(w.abs().max()) for _, w in rep.values() if w.numel())
        for key, (got, want) in rep.items():
            _close(got, want, f"rank {rank} {key}", 1e-10, scale)
