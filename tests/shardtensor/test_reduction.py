"""Porting step 2 of issue 22: reductions, indexing, shape ops and linalg on the aten-level
ShardTensor (``meshshard.shardtensor._aten``), against one process on the full data.

On 2, 3 and 4 gloo ranks (one spawn per world size for every case), layouts with an empty and a
one-row shard and a 2-D mesh: every case's outputs, and the gradients of a random projection of
them w.r.t. the sharded leaf and the plain weights (``torch.autograd.grad``), plus one
``create_graph=True`` second-order case, equal one process in fp64. Layouts the rules cannot do
fail with an error naming the op and the problem. One plain ``torch.compile`` function mixing
the ops has no graph break, compiles at most twice over three sizes, and equals eager.
"""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _aten_ops_fns as F

# measured: the largest relative difference from one process over every case and layout here
# is 1.8e-15 (the softmax and all/any cases added later: 4.1e-16 of the largest value)
# (fp64 rounding); 1e-10 leaves room for other summation orders
_RTOL64 = 1e-10
# sizes of the sharded dim per rank; a pair of tuples is a 2-D mesh (2 x 2): dim 1 over mesh
# dim 0 and dim 0 over mesh dim 1
LAYOUTS = {2: [(3, 5), (0, 8)], 3: [(1, 0, 6)], 4: [(2, 1, 0, 5), ((3, 5), (1, 1))]}
_CACHE: dict = {}


def _reports(world):
    if world not in _CACHE:
        _CACHE[world] = run_ranks(F.all_cases, world, LAYOUTS[world], timeout=300,
                                  collective_timeout=60)
    return _CACHE[world]


def _close(a, b, what, rtol=_RTOL64):
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    if not a.dtype.is_floating_point:
        assert a.dtype == b.dtype and torch.equal(a, b), f"{what}: {a} != {b}"
        return
    atol = rtol * float(b.abs().max()) if b.numel() else 0.0
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_every_rule_forward_and_gradients_equal_one_process(world):
    for rank, per_layout in enumerate(_reports(world)):
        for layout, rep in per_layout.items():
            cases = rep["cases"]
            two_d = isinstance(layout[0], tuple)
            for name, (_, _, mesh2d, grad) in F.CASES.items():
                if two_d and not mesh2d:
                    continue
                assert f"{name} out 0" in cases, (rank, layout, name)
                if grad:
                    assert f"{name} grad 0" in cases, (rank, layout, name)
            assert "second order d2" in cases
            for key, (got, want) in cases.items():
                _close(got, want, f"rank {rank} layout {layout} {key}")


# what each refused layout's error must say
_ERRORS = {
    "gather with a sharded index along the sharded dim": "a sharded index along the sharded",
    "index tensor on the sharded dim": "an index tensor on the sharded dim 1",
    "boolean mask": "a boolean mask index",
    "unbind along the sharded dim": "aten.unbind.int over the sharded dim 1",
    "unknown op": "no sharding rule for aten.sort",
    "select out of range": "out of",
    "cat along the shard dim of a blocked": "along the blocked dim",
}


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_unsupported_layouts_fail_with_a_clear_error(world):
    for rank, per_layout in enumerate(_reports(world)):
        for layout, rep in per_layout.items():
            assert set(rep["errors"]) == set(_ERRORS)
            for key, text in rep["errors"].items():
                assert _ERRORS[key] in text, (rank, layout, key, text)


def test_plain_torch_compile_of_a_mix_has_no_graph_break_and_equals_eager():
    # three sizes with the same pattern of empty all-to-all chunks: static, then dynamic, then
    # reused (a layout whose chunks become empty recompiles: dynamo specialises sizes 0 and 1)
    layouts = [(3, 5), (4, 6), (5, 7)]
    for rank, rep in enumerate(run_ranks(F.compile_case, 2, layouts, timeout=600,
                                         collective_timeout=300)):
        assert rep["graph breaks"] == 0, rep["break reasons"]
        assert 1 <= rep["compiles"] <= 2, rep["compiles"]
        for layout, pair in zip(layouts, rep["pairs"]):
            for k, (got, want) in enumerate(zip(pair["compiled"], pair["eager"])):
                # the same aten ops in the same order under aot_eager: equal to fp64 rounding
                _close(got, want, f"rank {rank} {layout} compiled output {k}")
