"""The dispatch caches must never change a result: layouts change between calls of the same
ops (uneven, empty and replicated shards, back and forth), sizes that differ still move rows,
and registering a handler re-routes ops that were cached."""

from meshshard.testing import run_ranks
from tests.shardtensor import _cache_fns as F

KEYS = ("value", "x_grad", "w_grad", "b_grad")


def test_same_ops_on_changing_layouts_match_the_oracle():
    layouts = [((3, 5), "shard"), ((0, 8), "shard"), ((3, 5), "shard"), ((8, 0), "rep"),
               ((5, 3), "shard"), ((3, 5), "shard"), ((8, 0), "rep")]
    for ranks in run_ranks(F.layout_sequence, 2, layouts):
        for i, r in enumerate(ranks):
            for k in KEYS:
                assert r[k] is True, (i, layouts[i], k)


def test_three_ranks_with_a_single_row_shard():
    layouts = [((1, 1, 6), "shard"), ((6, 1, 1), "shard"), ((1, 1, 6), "shard")]
    for ranks in run_ranks(F.layout_sequence, 3, layouts):
        for i, r in enumerate(ranks):
            for k in KEYS:
                assert r[k] is True, (i, layouts[i], k)


def test_different_sizes_still_redistribute_after_the_same_layout_was_cached():
    for r in run_ranks(F.mismatched_sizes_still_communicate, 2):
        assert [ok for _, ok in r] == [True] * 4
        assert [s for s, _ in r] == [(3, 5), (3, 5), (3, 5), (0, 8)]


def test_registering_a_handler_reroutes_a_cached_pointwise_op():
    for r in run_ranks(F.registry_change_reroutes, 2):
        assert r == {"first": True, "during": True, "calls": 1, "after": True}


def test_mesh_group_memo_is_the_meshs_own_group():
    for r in run_ranks(F.mesh_group_memo, 4):
        assert r == [True, True]
