"""The device cell list (backend="grid") against a float64 oracle and cKDTree: ties by index,
duplicates, clustered and flat clouds, 1-3 dimensions, queries outside the points' box, the
capped ball query, and the host syncs one query makes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree

from meshshard.ops import kernels
from meshshard.ops.cell_index import CellIndex
from meshshard.testing.sync_census import sync_census
from tests.ops._data import cloud, oracle_knn, oracle_radius


def _flat(n: int, seed: int) -> np.ndarray:
    p = np.random.default_rng(seed).random((n, 3))
    p[:, 2] = 0.5  # a surface: one cell thick
    return p


CLOUDS = {
    "uniform": lambda n, s: cloud(n, "uniform", seed=s),
    "clustered": lambda n, s: cloud(n, "clustered", seed=s),
    "dupes": lambda n, s: cloud(n, "dupes", seed=s),
    "flat": _flat,
    "2d": lambda n, s: np.random.default_rng(s).random((n, 2)),
    "1d": lambda n, s: np.random.default_rng(s).random((n, 1)),
    "far_queries": lambda n, s: np.random.default_rng(s).random((n, 3)) * (1 if s == 3 else 3),
}


@pytest.mark.parametrize("kind", sorted(CLOUDS))
@pytest.mark.parametrize("k", [1, 7, 40])
def test_knn_equals_oracle(kind: str, k: int) -> None:
    x = CLOUDS[kind](400, 3)
    y = CLOUDS[kind](90, 4)
    d2, idx = CellIndex(torch.from_numpy(x)).knn(torch.from_numpy(y), k)
    np.testing.assert_array_equal(idx.numpy(), oracle_knn(x, y, k))
    ref = ((y[:, None, :] - x[idx.numpy()]) ** 2).sum(-1)
    np.testing.assert_allclose(d2.numpy(), ref, rtol=1e-12)
    if kind != "dupes":
        _, want = cKDTree(x).query(y, k=k)
        want = np.asarray(want).reshape(len(y), k)
        assert all(set(a) == set(b) for a, b in zip(idx.tolist(), want.tolist()))


@pytest.mark.parametrize("kind", ["uniform", "clustered", "dupes", "flat"])
def test_radius_equals_oracle(kind: str) -> None:
    x = CLOUDS[kind](400, 3)
    y = CLOUDS[kind](90, 3 if kind == "clustered" else 4)  # same blob centres
    r = {"uniform": 0.15, "clustered": 0.05, "dupes": 1.0, "flat": 0.1}[kind]
    want = oracle_radius(x, y, r)
    assert sum(len(w) for w in want) > 90
    ptr, idx, d2 = CellIndex(torch.from_numpy(x), cell=r).radius(torch.from_numpy(y), r)
    for q, w in enumerate(want):
        np.testing.assert_array_equal(idx[ptr[q] : ptr[q + 1]].numpy(), w)
    assert (d2.sqrt() <= r).all()
    for width in (1, 5):
        pd, pi = kernels.radius_padded(torch.from_numpy(x), torch.from_numpy(y), r, width,
                                       backend="grid")
        for q, w in enumerate(want):
            got = pi[q][pi[q] >= 0].numpy()
            np.testing.assert_array_equal(got, w[:width])
            assert torch.isinf(pd[q][pi[q] < 0]).all()


def test_key_breaks_ties() -> None:
    x = torch.tensor([[0.0, 0, 0], [1, 0, 0], [-1, 0, 0], [0, 1, 0]], dtype=torch.float64)
    key = torch.tensor([9, 3, 5, 1])
    d2, idx = CellIndex(x, key=key).knn(torch.zeros(1, 3, dtype=torch.float64), 3)
    assert idx.tolist() == [[0, 3, 1]]  # distance 0, then keys 1 < 3 < 5 at distance 1
    _, pi = kernels.radius_padded(x, torch.zeros(1, 3, dtype=torch.float64), 1.0, 2,
                                  backend="grid", key=key)
    assert pi.tolist() == [[0, 3]]


def test_fewer_points_than_k_and_empty() -> None:
    x = torch.rand(3, 3, dtype=torch.float64)
    d2, idx = CellIndex(x).knn(torch.rand(4, 3, dtype=torch.float64), 5)
    assert (idx[:, 3:] == -1).all() and torch.isinf(d2[:, 3:]).all()
    assert sorted(idx[0, :3].tolist()) == [0, 1, 2]
    d2, idx = kernels.knn(x[:0], x, 2, backend="grid")
    assert (idx == -1).all()
    ptr, idx, _ = kernels.radius(x[:0], x, 0.5, backend="grid")
    assert ptr.tolist() == [0, 0, 0, 0] and idx.numel() == 0
    d2, idx = CellIndex(x).knn(x[:0], 2)
    assert idx.shape == (0, 2)


def test_float32_and_bad_dims() -> None:
    x = torch.rand(300, 3)
    _, idx = kernels.knn(x, x[:30], 5, backend="grid")
    np.testing.assert_array_equal(idx.numpy(), oracle_knn(x.double().numpy(),
                                                          x[:30].double().numpy(), 5))
    with pytest.raises(ValueError, match="backend='kdtree' or 'brute'"):
        kernels.knn(torch.rand(10, 5), torch.rand(2, 5), 2, backend="grid")


def test_host_syncs_per_query() -> None:
    """Bounds given: a kNN reads back its two passes' chunk widths, a capped ball query one."""
    x = torch.from_numpy(cloud(2000, "clustered", seed=1))
    lo, hi = x.amin(0).tolist(), x.amax(0).tolist()
    with sync_census() as c:
        index = CellIndex(x, bounds=(lo, hi))
        index.knn(x[:500], 8)
    assert c.total == 2, c.report()
    with sync_census() as c:
        CellIndex(x, cell=0.05, bounds=(lo, hi)).radius_padded(x[:500], 0.05, 16)
    assert c.total == 1, c.report()
