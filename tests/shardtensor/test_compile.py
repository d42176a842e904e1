"""Plain ``torch.compile`` over ShardTensors, against the same code eager (whose equality with one
process the oracle tests check on the same layouts: ``test_autograd``, ``test_grid_conv``,
``test_graph_rows``, ``test_<family>``).

- The reference Transolver over six layouts of different sizes: one graph, at most two
  compilations; with inductor and an empty shard in the first compiled layout.
- Functions mixing the rules of several families: no graph break, at most two compilations over
  three sizes.
- On 3 and 4 gloo ranks with an empty shard: the Transolver, the grid UNet and MeshGraphNet. Under
  compile the traced backward sums the weight gradients in one collective
  (``_aten/grad_bucket``); on the rank with the empty shard its pieces are constants, so this
  also checks that every rank still runs the same collectives in the same order.
- Activation checkpointing inside the compiled Transolver, against one process.
"""

import pytest

from meshshard.testing import run_ranks
from tests.graph._data import empty_and_isolated, first_empty
from tests.shardtensor import _compile_fns, _graph_rows_fns, _grid_conv_fns, _training_fns
from tests.shardtensor._oracle import close

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


def test_plain_torch_compile_captures_one_graph_and_compiles_at_most_twice():
    layouts = [(45, 55), (70, 50), (130, 90), (30, 150), (200, 110), (80, 81)]
    reports = run_ranks(_training_fns.compile_case, 2, layouts, timeout=600)
    for rank, rep in enumerate(reports):
        assert rep["graph breaks"] == 0, rep["graph breaks"]
        # the first layout compiles static, the second dynamic; the other four reuse it
        assert 1 <= rep["compiles"] <= 2, rep["compiles"]
        assert len(rep["per layout"]) == len(layouts)
        for sizes, pair in zip(layouts, rep["per layout"]):
            for k, (got, want) in enumerate(zip(pair["compiled"], pair["eager"])):
                # the same aten ops in the same order: equal up to fp32 rounding of fused
                # reorderings (aot_eager runs them unfused: equal in practice)
                close(got, want, f"rank {rank} {sizes} output {k}", 1e-6)


@pytest.mark.slow  # ~1 min: one inductor compile (forward and backward) per rank
def test_inductor_with_an_empty_shard_in_the_first_compiled_layout_equals_eager():
    # Regression: dynamo compiles rank 0's graph with a statically empty piece, so
    # its partial sums are constants; inductor ignores the collectives' effect tokens and
    # reordered them on that rank only (gloo "collective mismatch"). collective_ops.py chains
    # each traced collective to the previous one's output.
    reports = run_ranks(_training_fns.compile_floor_case, 2, [(0, 20)], timeout=600)
    for rank, rep in enumerate(reports):
        assert rep["graph breaks"] == 0, rep["graph breaks"]
        pair = rep["per layout"][0]
        trios = [t for t in zip(pair["compiled"], pair["eager"], pair["fp64"]) if t[0].numel()]
        # the floor: how far fp32 rounding alone moves the eager step (from fp64), relative to
        # each output's scale, the largest over the step's outputs (measured 2.3e-6 to 8.3e-6
        # on 20-161 points; inductor's fused kernels moved compiled from eager by 1.0-1.3x it)
        floor = max(float((e.double() - d).abs().max() / d.abs().max()) for _, e, d in trios)
        assert floor > 0
        for k, (got, want, exact) in enumerate(trios):
            err = float((got - want).abs().max() / exact.abs().max())
            assert err <= 4 * floor, (rank, k, err, floor)


# three sizes with the same pattern of empty all-to-all chunks: static, then dynamic, then
# reused (a layout whose chunks become empty recompiles: dynamo specialises sizes 0 and 1)
@pytest.mark.parametrize("fn", [_compile_fns.reductions_indexing_shape_case,
                                _compile_fns.layer_norm_respec_view_case],
                         ids=["reductions_indexing_shape", "layer_norm_respec_view"])
def test_plain_torch_compile_of_a_mix_of_rules_has_no_graph_break_and_equals_eager(fn):
    layouts = [(3, 5), (4, 6), (5, 7)]
    for rank, rep in enumerate(run_ranks(fn, 2, layouts, timeout=600, collective_timeout=300)):
        assert rep["graph breaks"] == 0, rep["break reasons"]
        assert 1 <= rep["compiles"] <= 2, rep["compiles"]
        for layout, pair in zip(layouts, rep["pairs"]):
            for k, (got, want) in enumerate(zip(pair["compiled"], pair["eager"])):
                # the same aten ops in the same order under aot_eager: equal to fp64 rounding
                close(got, want, f"rank {rank} {layout} compiled output {k}")


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
                close(got, want, f"{model} rank {rank} output {k}", rtol, scale)
        mgn = rep["mgn"]
        assert mgn["graph breaks"] == 0
        for k, (got, want) in enumerate(zip(mgn["compiled"], mgn["eager"])):
            close(got, want, f"mgn rank {rank} tensor {k}", 1e-10)


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
            close(got, want, f"rank {rank} {key}", 1e-10, scale)
