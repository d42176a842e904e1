import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _api_fns as F


@pytest.mark.parametrize("sizes", [(3, 5), (0, 8), (2, 0, 5, 1)])
def test_construction_conversion_redistribute(sizes):
    for rank, r in enumerate(run_ranks(F.construction, len(sizes), sizes)):
        assert r["inferred"] == sizes
        assert r["shape"] == (sum(sizes), 3)
        assert r["local_shape"] == (sizes[rank], 3)
        assert r["sharding_shapes"] == [(s, 3) for s in sizes]
        for key in ("full_equal", "scatter_equal", "rebalance_equal", "replicate_equal",
                    "back_equal", "rebalance_grad_ok", "grad_is_shardtensor"):
            assert r[key] is True, key
        assert r["sum"] == r["sum_ref"]
        P = len(sizes)
        assert r["partial_sum"] == [P * (P + 1) / 2, -P * (P - 1) / 2]
        assert r["partial_avg"] == pytest.approx([(P + 1) / 2, -(P - 1) / 2])
        assert r["partial_max"] == [float(P), 0.0]


def test_declared_sizes_wrong_on_every_rank_raise_everywhere():
    errs = run_ranks(F.bad_declared_sizes, 2, timeout=60)
    assert all(e and "disagree with the actual local sizes (3, 5)" in e for e in errs), errs


def test_declared_sizes_wrong_on_one_rank_raise_everywhere_no_hang():
    errs = run_ranks(F.bad_declared_one_rank, 2, timeout=60)
    assert "declared sharding sizes (3, 6)" in errs[0], errs
    assert all(e and "ranks declared different sharding sizes" in e for e in errs), errs
    assert all(e is not None for e in errs), errs


def test_local_shapes_must_agree_outside_sharded_dim():
    errs = run_ranks(F.bad_shapes_outside_shard_dim, 2, timeout=60)
    assert all(e and "may differ only in the sharded dim" in e for e in errs), errs


def test_bad_layouts_give_clear_errors_on_every_rank():
    for r in run_ranks(F.bad_misc, 2, timeout=60):
        assert "2 entries but the DeviceMesh has 1" in r["placements_vs_mesh"]
        assert "out of range" in r["shard_dim_range"]
        assert "different DeviceMeshes" in r["different_meshes"]
        assert "sharded differently" in r["different_dims"]
        assert "broadcast" in r["bad_global_shapes"]
        assert "no sharding rule for torch.fft.fft" in r["no_rule"]
        # names the aten op and the public way to add a rule
        assert "aten._fft_r2c" in r["no_rule"]
        assert "meshshard.shardtensor.register_rule(torch.ops.aten._fft_r2c" in r["no_rule"]
        assert "sharded" in r["item_of_sharded"]
        assert r["auto_redistribute_sizes"] == ((3, 5), 32.0)


@pytest.mark.parametrize("sizes", [(3, 5), (0, 8)])
def test_ops_without_a_rule_run_locally_where_exact_else_name_the_way_out(sizes):
    for r in run_ranks(F.no_rule, 2, sizes, timeout=60):
        for name in ("sort over the sharded dim", "renorm (its dim is not the one it works "
                     "along)", "random op on replicated copies"):
            kind, text = r.pop(name)
            assert kind == "NoShardingRuleError", (name, kind)
            assert "aten." in text and "Replicate" in text, (name, text)
        for name, (got, want, same_layout) in r.items():
            # sorting and comparisons move values without arithmetic: exact; the Partial is
            # summed first (fp64 sum of 2 scaled copies: within 1e-15 relative)
            torch.testing.assert_close(got, want, rtol=1e-14, atol=0, msg=name)
            assert same_layout, name


def test_repr_str_format_len():
    for r, s, f, n in run_ranks(F.printing, 2, timeout=60):
        assert "ShardTensor" in r and "S(0)[3, 5]" in r and "global (8, 2)" in r
        assert s == r
        assert f == "16.0"
        assert n == 8


@pytest.mark.parametrize("sizes", [(3, 5), (7, 0, 13)])
def test_sharding_shapes_in_physicsnemo_forms(sizes):
    for got, errors in run_ranks(F.sharding_shape_forms, len(sizes), sizes, timeout=60):
        assert set(got.values()) == {sizes}, got
        for name, err in errors.items():
            assert err is not None and err[0] == "LayoutError", (name, err)
            assert "sharding" in err[1], (name, err)
