"""Chunked inference equals the unchunked forward: one process and 1-3 gloo ranks on uneven
layouts (empty ranks included), for chunks smaller than, equal to and larger than a shard.
Tolerance: the fp32 rounding floor against fp64 is ~2.5e-7 relative here; the issue's bound
is 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard.apps.chunked import (
    ReductionAdapter,
    chunked_forward,
    reduction_modules,
    register_reduction,
)
from meshshard.testing.distributed import run_ranks
from tests.apps._fns import chunked_rank, model_and_data

RTOL = 1e-5


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("chunk", [3, 256, 1999, 2000, 10**6])
def test_one_process(chunk):
    model, c, f = model_and_data()
    with torch.no_grad():
        ref = model(c, f)
    got = chunked_forward(model, (c, f), max_points_per_chunk=chunk, group=False)
    assert got.shape == ref.shape
    assert _rel(got, ref) <= RTOL
    # the model is left as it was: forward is the class's again
    assert all("forward" not in m.__dict__ for _, m in reduction_modules(model))
    assert len(reduction_modules(model)) == 3


def test_chunks_differ_from_a_model_without_the_sums():
    """The check can fail: dropping one chunk's partial sums changes the output."""
    model, c, f = model_and_data()
    with torch.no_grad():
        ref = model(c, f)
        half = chunked_forward(model, (c[:, :1000], f[:, :1000]), max_points_per_chunk=100,
                               group=False)
    assert _rel(half, ref[:, :1000]) > 1e-3


LAYOUTS = {
    1: [[600]],
    2: [[225, 375], [0, 600]],
    3: [[75, 75, 450], [599, 0, 1]],
}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_uneven(world):
    layouts = LAYOUTS[world]
    chunks = [1, 97, 400, 5000] if world > 1 else [97, 5000]
    out = run_ranks(chunked_rank, world, layouts, chunks, timeout=300)
    for li, sizes in enumerate(layouts):
        model, c, f = model_and_data(sum(sizes))
        with torch.no_grad():
            ref = model(c, f).numpy()
        for ch in chunks:
            got = np.concatenate([out[r][(li, ch)] for r in range(world)], axis=1)
            assert got.shape == ref.shape
            assert _rel(got, ref) <= RTOL, (sizes, ch)


class _MeanPool(torch.nn.Module):
    """x + mean over points: a reduction module registered through an adapter."""

    def forward(self, x):
        return x + x.mean(dim=1, keepdim=True)


class _Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.pool = _MeanPool()

    def forward(self, x):
        return self.pool(torch.tanh(self.lin(x)))


def test_registered_adapter():
    register_reduction(_MeanPool, ReductionAdapter(
        partial=lambda m, x: torch.cat([x.sum(dim=1), torch.full((x.shape[0], 1), x.shape[1],
                                                                 dtype=x.dtype)], dim=1),
        finish=lambda m, total, x: x + (total[:, :-1] / total[:, -1:]).unsqueeze(1),
    ))
    model = _Pooled()
    x = torch.randn(2, 300, 3)
    with torch.no_grad():
        ref = model(x)
    got = chunked_forward(model, (x,), max_points_per_chunk=41, group=False)
    assert _rel(got, ref) <= RTOL
    with pytest.raises(ValueError, match="already has a reduction adapter"):
        register_reduction(_MeanPool, ReductionAdapter(lambda m, x: x, lambda m, t, x: x))


def test_bad_arguments():
    model, c, f = model_and_data(10)
    with pytest.raises(ValueError, match="max_points_per_chunk=0 must be >= 1"):
        chunked_forward(model, (c, f), max_points_per_chunk=0)
    with pytest.raises(ValueError, match="different point counts"):
        chunked_forward(model, (c, f[:, :5]), max_points_per_chunk=3, group=False)
