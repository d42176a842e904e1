from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard.partition import hilbert, hilbert_codes, morton, morton_codes, partition
from meshshard.partition.sfc import curve_order


def _grid(side: int, dim: int) -> np.ndarray:
    axes = np.meshgrid(*[np.arange(side)] * dim, indexing="ij")
    return np.stack(axes, -1).reshape(-1, dim).astype(float)


@pytest.mark.parametrize("dim,bits", [(2, 4), (3, 3), (2, 1), (3, 4)])
def test_hilbert_visits_every_cell_through_face_neighbours(dim, bits):
    g = _grid(1 << bits, dim)
    codes = hilbert_codes(g, bits=bits)
    assert np.unique(codes).size == g.shape[0]
    assert codes.max() == g.shape[0] - 1
    path = g[np.argsort(codes)]
    steps = np.abs(np.diff(path, axis=0)).sum(axis=1)
    assert np.all(steps == 1)  # consecutive codes are face-adjacent cells
    assert np.all(path[0] == 0)  # the curve starts in the origin corner


def _morton_reference(q: np.ndarray, bits: int) -> list[int]:
    dim = q.shape[1]
    out = []
    for row in q.tolist():
        code = 0
        for b in range(bits - 1, -1, -1):
            for axis in range(dim):
                code = (code << 1) | ((row[axis] >> b) & 1)
        out.append(code)
    return out


@pytest.mark.parametrize("dim,bits", [(3, 21), (2, 31), (3, 5)])
def test_morton_matches_bitwise_reference(dim, bits):
    rng = np.random.default_rng(1)
    q = rng.integers(0, 1 << bits, size=(200, dim))
    # pin the bounding cube so quantisation is the identity on these integers
    q[0] = 0
    q[1] = (1 << bits) - 1
    codes = morton_codes(q.astype(float), bits=bits)
    assert codes.tolist() == _morton_reference(q, bits)


@pytest.mark.parametrize("method", ["morton", "hilbert"])
@pytest.mark.parametrize("dim", [2, 3])
def test_equal_split_contiguous_on_curve(method, dim):
    rng = np.random.default_rng(2)
    pts = rng.normal(size=(1003, dim))
    p = partition(pts, 7, method=method)
    assert p.sizes.max() - p.sizes.min() <= 1
    codes = (hilbert_codes if method == "hilbert" else morton_codes)(pts, bits=p.params["bits"])
    stored = codes[p.order]
    assert np.all(np.diff(stored.astype(np.float64)) >= 0)  # shards are curve pieces in order
    assert p.method == method


def test_targets_weights_and_empty_parts():
    rng = np.random.default_rng(3)
    pts = rng.random((2000, 3))
    p = hilbert(pts, 4, targets=[0.1, 0.0, 0.6, 0.3])
    assert p.sizes.tolist() == [200, 0, 1200, 600]
    w = rng.random(2000) * 3
    p = morton(pts, 5, weights=w)
    loads = np.bincount(p.assignment, weights=w, minlength=5)
    assert np.abs(loads - w.sum() / 5).max() <= w.max()
    tiny = hilbert(pts[:2], 4, allow_empty=True)
    assert tiny.sizes.sum() == 2 and tiny.nparts == 4


def test_skewed_weights_still_fill_every_part():
    pts = np.random.default_rng(4).random((10, 3))
    w = np.ones(10)
    w[np.argmin(hilbert_codes(pts))] = 1e6  # one point holds nearly all the weight
    p = hilbert(pts, 4, weights=w)
    assert (p.sizes >= 1).all()
    allowed = hilbert(pts, 4, weights=w, allow_empty=True)
    assert (allowed.sizes == 0).any()  # without the guarantee the heavy point starves parts


def test_deterministic_and_accepts_torch():
    pts = np.random.default_rng(5).random((500, 3)).astype(np.float32)
    a = partition(pts, 3)
    b = partition(torch.from_numpy(pts), 3)
    assert a == b
    dup = np.repeat(pts[:5], 20, axis=0)  # many identical points: ties broken by index
    c1, c2 = hilbert(dup, 4), hilbert(dup.copy(), 4)
    assert c1 == c2
    assert np.array_equal(c1.order, curve_order(hilbert_codes(dup, bits=c1.params["bits"])))


@pytest.mark.parametrize("method", ["hilbert", "morton"])
def test_float32_points_cut_as_their_float64_copy(method):
    """float32 coordinates are not copied to float64, yet quantise identically."""
    rng = np.random.default_rng(11)
    pts = (rng.random((4000, 3)) * [4.6, 2.1, 1.5] - [1.0, 1.05, 0.0]).astype(np.float32)
    a = partition(pts, 5, method=method)
    b = partition(pts.astype(np.float64), 5, method=method)
    assert a == b
    codes = hilbert_codes if method == "hilbert" else morton_codes
    np.testing.assert_array_equal(codes(pts, bits=21), codes(pts.astype(np.float64), bits=21))
    for bad in (np.nan, np.inf, -np.inf):
        broken = pts.copy()
        broken[17, 2] = bad
        with pytest.raises(ValueError, match=r"1 row\(s\) with NaN or inf.*first at row 17"):
            partition(broken, 5, method=method)


def test_curve_order_stable_for_wide_codes():
    codes = np.array([5, 1, 5, 1, 2**62, 0], dtype=np.uint64)
    assert curve_order(codes).tolist() == [5, 1, 3, 0, 2, 4]
    assert np.array_equal(curve_order(codes), np.argsort(codes, kind="stable"))


def test_single_part_and_degenerate_box():
    p = morton(np.ones((7, 3)), 1)
    assert p.sizes.tolist() == [7]
    q = hilbert(np.ones((8, 3)), 2)
    assert q.sizes.tolist() == [4, 4]
