"""What both ghost-row refiners guarantee, checked on each: the k-way FM pass
(:func:`~meshshard.partition.refine_volume`) and the vectorised one
(:func:`~meshshard.partition.fastrefine.refine_volume_fast`). Their own options and their use
inside METIS are tested in ``test_volrefine.py`` and ``test_fastrefine.py``."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from meshshard.partition import communication_volume, refine_volume
from meshshard.partition.fastrefine import refine_volume_fast
from tests.partition._refine_data import _brute_volume, _grid, _slabs

REFINERS = {"volume": refine_volume, "fast": refine_volume_fast}
each_refiner = pytest.mark.parametrize("refiner", sorted(REFINERS))


@pytest.mark.parametrize(
    ("refiner", "parts"),
    [("volume", 2), ("volume", 3), ("volume", 5), ("fast", 2), ("fast", 3), ("fast", 5),
     ("fast", 16)],
)  # fmt: skip
def test_refining_a_slab_cut_lowers_ghost_rows_in_balance(cloud, trimesh, refiner, parts):
    refine = REFINERS[refiner]
    for pts, g in (cloud, trimesh):
        a = _slabs(pts[:, 0], np.ones(len(pts)), np.full(parts, 1 / parts))
        before = _brute_volume(g, a)
        b = refine(g, a, parts)
        after = _brute_volume(g, b)
        assert communication_volume(g, b, parts) == after
        assert communication_volume(g, a, parts) == before
        assert after < before  # a slab cut of a random graph is far from a local optimum
        assert np.bincount(b, minlength=parts).max() <= np.floor(1.03 * len(pts) / parts)


@each_refiner
def test_balance_weighted_nonuniform_and_zero_target(cloud, refiner):
    refine = REFINERS[refiner]
    pts, g = cloud
    w = np.random.default_rng(3).uniform(0.2, 3.0, len(pts))
    for targets, uf in (([0.25] * 4, 30), ([0.5, 0.3, 0.0, 0.2], 30), ([0.4, 0.0, 0.6], 5)):
        t = np.asarray(targets)
        P = t.size
        a = _slabs(pts[:, 0], w, t)
        cap = (1 + uf / 1000) * t * w.sum()
        assert (np.bincount(a, weights=w, minlength=P) <= cap + 1e-9).all()  # input in balance
        b = refine(g, a, P, weights=w, targets=t, ufactor=uf)
        assert (np.bincount(b, weights=w, minlength=P) <= cap + 1e-9).all()
        assert (np.bincount(b, minlength=P)[t == 0] == 0).all()  # zero targets stay empty
        assert _brute_volume(g, b) < _brute_volume(g, a)


@each_refiner
def test_part_over_its_cap_only_shrinks(refiner):
    refine = REFINERS[refiner]
    g = _grid(12, 12)
    a = (np.arange(144) % 12 >= 3).astype(np.int64)  # part 1 holds 108 of 144: over its cap
    b = refine(g, a, 2)
    assert np.bincount(b, minlength=2)[1] <= 108
    assert _brute_volume(g, b) <= _brute_volume(g, a)


@each_refiner
def test_parts_without_a_boundary_are_unchanged(refiner):
    refine = REFINERS[refiner]
    blocks = sp.block_diag([_grid(5, 5)] * 3).tocsr()  # three components, one per part
    comp = np.repeat([2, 0, 1], 25)
    np.testing.assert_array_equal(refine(blocks, comp, 3), comp)
    assert refine(_grid(4, 4), np.zeros(16, dtype=int), 1).tolist() == [0] * 16


@each_refiner
def test_same_result_per_seed_and_input_kept(trimesh, refiner):
    refine = REFINERS[refiner]
    pts, g = trimesh
    a = _slabs(pts[:, 1], np.ones(len(pts)), [0.25] * 4)
    keep = a.copy()
    for seed in (0, 7):
        np.testing.assert_array_equal(refine(g, a, 4, seed=seed), refine(g, a.copy(), 4, seed=seed))
    np.testing.assert_array_equal(a, keep)


@each_refiner
def test_bad_inputs_raise_clear_errors(refiner):
    refine = REFINERS[refiner]
    g = _grid(4, 4)
    a = np.repeat([0, 1], 8)
    with pytest.raises(ValueError, match=r"shape \(16,\)"):
        refine(g, a[:-1], 2)
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        refine(g, a + 1, 2)
    with pytest.raises(ValueError, match="ufactor"):
        refine(g, a, 2, ufactor=-1)
    with pytest.raises(ValueError, match="targets"):
        refine(g, a, 2, targets=[0.5, 0.6])
    with pytest.raises(TypeError, match="scipy.sparse"):
        refine(g.toarray(), a, 2)
