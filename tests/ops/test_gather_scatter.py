"""gather_neighbors / scatter_to_owners by global index against single-process torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.ops._fns import _weights
from tests.ops.test_halo import results


@pytest.mark.parametrize("P", [2, 4])
def test_gather_neighbors(P: int, tmp_path_factory) -> None:
    sizes, _, res = results(P, tmp_path_factory)
    N = sum(sizes)
    feats = torch.arange(N * 2, dtype=torch.float64).reshape(N, 2).requires_grad_()
    padded = torch.cat([feats, torch.zeros(1, 2, dtype=torch.float64)])
    loss = 0
    for p, r in enumerate(res):
        idx = torch.as_tensor(r["gather_index"])
        assert (idx == -1).any() and (idx >= 0).any()
        want = padded[torch.where(idx < 0, N, idx)]
        np.testing.assert_array_equal(r["gather"], want.detach().numpy())
        loss = loss + (want * _weights(want.shape, p)).sum()
    loss.backward()
    np.testing.assert_allclose(np.concatenate([r["gather_grad"] for r in res]), feats.grad)


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_scatter_to_owners(P: int, reduce: str, tmp_path_factory) -> None:
    sizes, _, res = results(P, tmp_path_factory)
    N = sum(sizes)
    vals = torch.cat([torch.as_tensor(r[f"scatter_{reduce}"][0]) for r in res]).requires_grad_()
    idx = torch.cat([torch.as_tensor(r["gather_index"]) for r in res]).reshape(-1)
    v = vals.reshape(-1, 2)
    keep = idx >= 0
    tgt = idx[keep][:, None].expand(-1, 2)
    red = {"sum": "sum", "mean": "mean", "max": "amax"}[reduce]
    want = torch.zeros(N, 2, dtype=torch.float64).scatter_reduce(
        0, tgt, v[keep], reduce=red, include_self=False
    )
    np.testing.assert_allclose(
        np.concatenate([r[f"scatter_{reduce}"][1] for r in res]), want.detach(), atol=1e-12
    )
    off = np.concatenate([[0], np.cumsum(sizes)])
    loss = sum((want[off[p] : off[p + 1]] * _weights((sizes[p], 2), p)).sum() for p in range(P))
    loss.backward()
    np.testing.assert_allclose(
        np.concatenate([r[f"scatter_{reduce}"][2] for r in res]), vals.grad, atol=1e-12
    )
