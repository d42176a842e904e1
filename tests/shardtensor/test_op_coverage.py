"""Op coverage as data: every rule in the registry is reached, on an uneven layout, by the
op-family oracle cases (which compare forward and gradients with one process), or is listed
below with the test that covers it elsewhere, or as having no uneven case yet. The lists cannot
go stale: an op listed here that the oracles now reach fails the test, as does a rule that is
neither reached nor listed (a new rule needs an oracle case: see docs/design/core.md)."""

from __future__ import annotations

import pytest

from meshshard.shardtensor._aten.registry import registered_rules
from meshshard.testing import run_ranks
from tests.shardtensor._coverage_fns import op_key, reached_ops

#: rules the oracle cases do not reach, with the test that exercises them on uneven layouts
ELSEWHERE = {
    "meshshard.row_gather.default": "tests/shardtensor/test_graph_rows.py",
    "meshshard.row_scatter.default": "tests/shardtensor/test_graph_rows.py",
    "meshshard.ghost_refresh.default": "tests/shardtensor/test_graph_rows.py",
    "meshshard.ghost_refresh_adjoint.default": "tests/shardtensor/test_graph_rows.py",
    "torch.nn.functional.multi_head_attention_forward":
        "tests/shardtensor/test_attention.py",
    "meshshard.einsum.default": "tests/shardtensor/test_tp.py",
    "TensorBase.__matmul__": "tests/shardtensor/test_tp.py",
    "aten.index_put_.default": "tests/shardtensor/test_index.py",
    "aten._index_put_impl_.default": "tests/shardtensor/test_index.py",
    "aten.adaptive_max_pool2d.default": "tests/shardtensor/test_grid_conv.py",
    "aten.adaptive_max_pool2d_backward.default": "tests/shardtensor/test_grid_conv.py",
    "aten._native_batch_norm_legit.default": "tests/graph/test_pyg_plug.py",
    "aten._native_batch_norm_legit.no_stats": "tests/graph/test_pyg_plug.py",
    "aten._local_scalar_dense.default": "tests/shardtensor/test_api.py",
    "TensorBase.item": "tests/shardtensor/test_api.py",
    "TensorBase.tolist": "tests/shardtensor/test_api.py",
}
#: rules with no oracle case on an uneven layout yet (each a gap to close), and why
NO_CASE_YET = {
    "aten.reshape.default": "CompositeImplicitAutograd: eager reshape decomposes to view or "
                            "_unsafe_view above dispatch; registered with them for traced graphs",
    "torch._VariableFunctionsClass.index_select": "torch.index_select with a row-sharded index "
                                                  "(the method form is covered)",
    "aten._adaptive_avg_pool3d.default": "registered with its 2-D sibling; no 3-D case",
    "aten._adaptive_avg_pool3d_backward.default": "registered with its 2-D sibling; no 3-D case",
    "aten.replication_pad1d.default": "registered per dims; only 2-D/3-D cases",
    "aten.replication_pad1d_backward.default": "registered per dims; only 2-D/3-D cases",
    "aten.reflection_pad3d.default": "registered per dims; only 1-D/2-D cases",
    "aten.reflection_pad3d_backward.default": "registered per dims; only 1-D/2-D cases",
    "aten.upsample_nearest1d.default": "registered per dims; only 2-D/3-D cases",
    "aten.upsample_nearest1d_backward.default": "registered per dims; only 2-D/3-D cases",
    "aten._native_batch_norm_legit_no_training.default": "batch norm in eval mode: no case",
    "aten._native_batch_norm_legit_functional.default": "functionalised batch norm (traced "
                                                        "graphs): no uneven case",
    "TensorBase.__float__": "the refusal for sharded tensors: no uneven case",
    "TensorBase.__int__": "the refusal for sharded tensors: no uneven case",
    "TensorBase.__bool__": "the refusal for sharded tensors: no uneven case",
    "TensorBase.numpy": "the refusal for sharded tensors: no uneven case",
}


@pytest.fixture(scope="module")
def reached():
    per_rank = run_ranks(reached_ops, 2, (3, 5), timeout=900)
    for rank, (_, failed) in enumerate(per_rank):
        assert not failed, f"rank {rank}: oracle cases failed: {sorted(failed)}"
    return set().union(*(set(ops) for ops, _ in per_rank))


def test_every_rule_is_covered_or_listed(reached):
    registered = {op_key(op) for op in registered_rules()}
    assert not set(ELSEWHERE) & set(NO_CASE_YET)
    stale = sorted((set(ELSEWHERE) | set(NO_CASE_YET)) - registered)
    assert stale == [], f"listed but not registered (remove from the lists): {stale}"
    missing = sorted(registered - reached - set(ELSEWHERE) - set(NO_CASE_YET))
    assert missing == [], f"rules no oracle case reaches on an uneven layout: {missing}"
    now_reached = sorted(reached & (set(ELSEWHERE) | set(NO_CASE_YET)))
    assert now_reached == [], f"now reached by the oracle cases (drop them from the lists): " \
                              f"{now_reached}"


def test_the_elsewhere_tests_exist():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert sorted(p for p in set(ELSEWHERE.values()) if not (root / p).is_file()) == []
