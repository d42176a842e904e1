"""Local kernels: every available backend gives the same answer as a float64 brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree

from meshshard.ops import kernels
from meshshard.ops._backends import WITH_CLUSTER, require_cluster
from tests.ops._data import cloud, oracle_knn, oracle_radius


@pytest.mark.parametrize("kind", ["uniform", "clustered", "dupes"])
def test_all_backends_agree_knn(kind: str) -> None:
    x = torch.tensor(cloud(300, kind, seed=3))
    y = torch.tensor(cloud(50, kind, seed=4))
    want = oracle_knn(x.numpy(), y.numpy(), 9)
    for be in kernels.available_backends():
        d2, idx = kernels.knn(x, y, 9, backend=be)
        np.testing.assert_array_equal(idx.numpy(), want, err_msg=be)
        ref = ((y[:, None] - x[idx]) ** 2).sum(-1)
        np.testing.assert_allclose(d2, ref, rtol=1e-12)
        assert (torch.diff(d2, dim=1) >= 0).all()
    if kind != "dupes":
        _, ref = cKDTree(x.numpy()).query(y.numpy(), k=9)
        assert all(set(a) == set(b) for a, b in zip(want.tolist(), ref.tolist()))


def test_brute_tiles_keep_ties_by_index(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "_TILE_PAIRS", 64)  # force many row and column tiles
    x = torch.tensor(cloud(500, "dupes", seed=5))
    y = torch.tensor(cloud(40, "dupes", seed=6))
    _, idx = kernels.knn(x, y, 12, backend="brute")
    np.testing.assert_array_equal(idx.numpy(), oracle_knn(x.numpy(), y.numpy(), 12))


@pytest.mark.parametrize("kind", ["uniform", "dupes"])
def test_all_backends_agree_radius(kind: str) -> None:
    x = torch.tensor(cloud(300, kind, seed=3))
    y = torch.tensor(cloud(50, kind, seed=4))
    r = 0.2 if kind == "uniform" else 1.0
    want = oracle_radius(x.numpy(), y.numpy(), r)
    for be in kernels.available_backends():
        ptr, idx, d2 = kernels.radius(x, y, r, backend=be)
        got = [idx[a:b].numpy() for a, b in zip(ptr[:-1], ptr[1:])]
        assert sum(len(w) for w in want) > 50
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=be)
        assert (d2.sqrt() <= r).all()


def test_padding_and_empty() -> None:
    x = torch.rand(3, 3, dtype=torch.float64)
    d2, idx = kernels.knn(x, torch.rand(4, 3, dtype=torch.float64), 5, backend="kdtree")
    assert (idx[:, 3:] == -1).all() and torch.isinf(d2[:, 3:]).all()
    assert (idx[:, :3] >= 0).all()
    d2, idx = kernels.knn(x[:0], x, 2)
    assert idx.shape == (3, 2) and (idx == -1).all()
    ptr, idx, d2 = kernels.radius(x[:0], x, 0.5)
    assert ptr.tolist() == [0, 0, 0, 0] and idx.numel() == 0


def test_float32_inputs() -> None:
    x = torch.rand(200, 3)
    _, idx = kernels.knn(x, x[:20], 4)
    want = oracle_knn(x.double().numpy(), x[:20].double().numpy(), 4)
    np.testing.assert_array_equal(idx.numpy(), want)


def test_backend_errors() -> None:
    with pytest.raises(ValueError, match="backend='nope' is not one of"):
        kernels.resolve_backend("nope", torch.device("cpu"))
    if not WITH_CLUSTER:
        with pytest.raises(ImportError, match=r"pip install -e '\.\[cluster\]'"):
            require_cluster()
        with pytest.raises(ImportError, match="torch_cluster"):
            kernels.knn(torch.rand(5, 3), torch.rand(2, 3), 2, backend="cluster")


@pytest.mark.skipif(not WITH_CLUSTER, reason="torch_cluster not installed")
def test_cluster_backend_in_auto_on_gpu() -> None:  # pragma: no cover - needs torch_cluster
    assert "cluster" in kernels.available_backends()
