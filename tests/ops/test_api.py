"""The ShardTensor-level API (meshshard.ops) on 2 gloo ranks: ShardTensors in and out,
answers equal to the local layer and to single-process oracles, gradients through to_local."""

from __future__ import annotations

import numpy as np
import pytest

from meshshard.testing.distributed import run_ranks
from tests.ops._data import knn_halo_plan, oracle_knn
from tests.ops._fns import shardtensor_api
from tests.ops._oracle import full


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    sizes, ysizes = [12, 28], [9, 0]
    x = full({"x_sizes": sizes}, 2)
    plan = knn_halo_plan(x, sizes, k=3)
    d = tmp_path_factory.mktemp("plan")
    plan.save(d)
    res = run_ranks(shardtensor_api, 2, sizes, ysizes, str(d))
    return sizes, ysizes, x, plan, res


def test_knn_shardtensor(outcome) -> None:
    sizes, ysizes, x, _, res = outcome
    y = full({"x_sizes": ysizes, "seed": 7}, 2)
    for r in res:
        assert r["knn_sizes"] == (tuple(ysizes), (9, 4), (9, 4))
        np.testing.assert_array_equal(r["knn"][1], r["knn_ref"][1])
        np.testing.assert_allclose(r["knn"][0], r["knn_ref"][0])
    got = np.concatenate([r["knn"][1] for r in res])
    np.testing.assert_array_equal(got, oracle_knn(x, y, 4))
    # gradients flowed back through to_local/from_local to both ranks' points
    assert np.abs(np.concatenate([r["knn_grad"][0] for r in res])).sum() > 0
    assert res[1]["knn_grad"][1].shape == (0, 3)


def test_radius_graph_halo_gather_scatter_shardtensor(outcome) -> None:
    sizes, ysizes, x, plan, res = outcome
    for rank, r in enumerate(res):
        assert r["radius"][0] == tuple(sizes) and r["radius"][1] == (40, 5)
        np.testing.assert_array_equal(r["radius"][2], r["radius_ref"])
        assert r["csr"][1][rank] == r["csr"][0][-1] == r["csr"][2].shape[0]
        assert r["graph"][1][rank] == sizes[rank] * 3
        np.testing.assert_array_equal(r["graph"][2], r["graph_ref"])
        assert list(r["halo"][0]) == [s + h for s, h in zip(sizes, plan.halo_sizes())]
        assert r["gather"][0] == tuple(ysizes) and r["gather"][1] == (9, 4, 3)
        assert r["scatter"][0] == tuple(sizes)
        assert "pass both as ShardTensors" in r["errors"]["mixed"]
        assert "must be sharded along dim 0" in r["errors"]["replicate"]
        assert "different device meshes" in r["errors"]["other_mesh"]
    # gather == the points at the knn indices; scatter counts how often each point is a neighbour
    idx = res[0]["knn"][1]
    np.testing.assert_array_equal(res[0]["gather"][2], x[idx])
    counts = np.bincount(idx.reshape(-1), minlength=x.shape[0]).astype(float)
    np.testing.assert_array_equal(np.concatenate([r["scatter"][1][:, 0] for r in res]), counts)
