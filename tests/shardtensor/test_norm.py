"""The swap's rows for the aten-level ShardTensor: layer norm over the sharded dim (global
two-pass moments, weights narrowed, weight gradients complete), pointwise operands sharded with
different per-rank sizes (respecced to the first's), and views splitting a sharded dim by whole
rows on one or two mesh dims, against one process on the full data.

On 2, 3 and 4 gloo ranks (one spawn per world size), layouts with an empty and a one-row shard
and a 2x2 mesh: every output and the gradients w.r.t. the sharded input and the plain weights
(``torch.autograd.grad``), plus a ``create_graph=True`` second-order case, equal one process in
fp64. Layouts that cannot be reconciled raise a ``LayoutError`` saying why. A plain
``torch.compile`` function using the three rules has no graph break and equals eager.
"""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _aten_norm_fns as F

# measured (largest |got - want| / max |want| over every case, layout and rank): 3.0e-12 for
# the weight gradient of the layer norm offset by 1e4 (its inputs' own rounding), 4.6e-15 for
# the second order, <= 3.4e-16 elsewhere. With a one-pass variance the offset case gave 2.2e-8,
# so 1e-10 tells the two apart and leaves room for other summation orders
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
    atol = rtol * float(b.abs().max()) if b.numel() else 0.0
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_rules_forward_and_gradients_equal_one_process(world):
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


_ERRORS = {
    "different dims": "LayoutError: aten.mul.Tensor: operands are sharded differently on "
                      "mesh dim 0 (output dim 0 as S(0)",
    "blocked against shard": "LayoutError: aten.add.Tensor: operands are sharded differently",
}


_ERRORS_2D = {
    "merge two sharded dims": "NotImplementedError: aten.view.default: (2, 8, 5) -> (16, 5) "
                              "merges dims sharded on two mesh dims",
}


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_layouts_that_cannot_be_reconciled_fail_with_a_clear_error(world):
    for rank, per_layout in enumerate(_reports(world)):
        for layout, rep in per_layout.items():
            want = _ERRORS_2D if isinstance(layout[0], tuple) else _ERRORS
            assert set(rep["errors"]) == set(want)
            for key, text in rep["errors"].items():
                assert text.startswith(want[key]), (rank, layout, key, text)


def test_plain_torch_compile_has_no_graph_break_and_equals_eager():
    layouts = [(3, 5), (4, 6), (5, 7)]
    for rank, rep in enumerate(run_ranks(F.compile_case, 2, layouts, timeout=600,
                                         collective_timeout=300)):
        assert rep["graph breaks"] == 0, rep["break reasons"]
        assert 1 <= rep["compiles"] <= 2, rep["compiles"]
        for layout, pair in zip(layouts, rep["pairs"]):
            for k, (got, want) in enumerate(zip(pair["compiled"], pair["eager"])):
                _close(got, want, f"rank {rank} {layout} compiled output {k}")
