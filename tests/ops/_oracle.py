"""Single-process oracles on the gathered (stored-order) data of a test case."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.spatial import cKDTree

from tests.ops._data import cloud, layout, oracle_knn


def full(case: dict, P: int, which: str = "x") -> np.ndarray:
    sizes = case[f"{which}_sizes"]
    pts = cloud(sum(sizes), case.get("kind", "uniform"), seed=case.get("seed", 0) + (which == "y"))
    method = case.get("method", "slab")
    part = layout(pts, sizes if method in ("slab", "random") else None, method, P)
    return part.apply(pts)


@dataclass(frozen=True)
class Gathered:
    """A neighbour-query case as one process sees it: every rank's rows in stored order."""

    x: np.ndarray  #: the points searched, shape (N, 3)
    y: np.ndarray | None  #: the queries, or None when the points query themselves
    loop: bool  #: a point is its own neighbour (self-queries only)

    @property
    def queries(self) -> np.ndarray:
        return self.x if self.y is None else self.y

    @property
    def exclude_self(self) -> bool:
        return self.y is None and not self.loop


def gathered(case: dict, P: int) -> Gathered:
    """The points, queries and ``loop`` of a kNN or radius case on ``P`` ranks."""
    y = full(case, P, "y") if "y_sizes" in case else None
    return Gathered(full(case, P, "x"), y, case.get("loop", True))


def full_weights(shapes: list[tuple], dtype=torch.float64) -> torch.Tensor:
    from tests.ops._fns import _weights

    return torch.cat([_weights(s, r) for r, s in enumerate(shapes)])


def knn_grads(x: np.ndarray, y: np.ndarray | None, index: np.ndarray, w: torch.Tensor):
    xt = torch.tensor(x, requires_grad=True)
    yt = xt if y is None else torch.tensor(y, requires_grad=True)
    d = torch.linalg.vector_norm(yt[:, None, :] - xt[torch.as_tensor(index)], dim=-1)
    (d * w).sum().backward()
    return d.detach().numpy(), xt.grad.numpy(), None if y is None else yt.grad.numpy()


def radius_grads(x: np.ndarray, y: np.ndarray | None, want: list[np.ndarray], w: torch.Tensor):
    """Distances of the CSR pairs ``want`` (query i's neighbours) and the gradients of their
    ``w``-weighted sum, by single-process autograd."""
    xt = torch.tensor(x, requires_grad=True)
    yt = xt if y is None else torch.tensor(y, requires_grad=True)
    rows = torch.cat([torch.full((len(nb),), i) for i, nb in enumerate(want)]).long()
    cols = torch.as_tensor(np.concatenate(want)).long()
    d = torch.linalg.vector_norm(yt[rows] - xt[cols], dim=-1)
    (d * w).sum().backward()
    return d.detach().numpy(), xt.grad.numpy(), None if y is None else yt.grad.numpy()


def assert_grads_match(per_rank: list[dict], d_ref, gx_ref, gy_ref) -> None:
    """The ranks' distances (to 1e-12) and input gradients (to 1e-10) against the oracle's."""
    np.testing.assert_allclose(np.concatenate([r["dist"] for r in per_rank]), d_ref, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([r["gx"] for r in per_rank]), gx_ref, atol=1e-10)
    if gy_ref is not None:
        np.testing.assert_allclose(np.concatenate([r["gy"] for r in per_rank]), gy_ref, atol=1e-10)


def assert_knn_matches_oracle(case: dict, P: int, per_rank: list[dict]) -> None:
    """The ranks' kNN of ``case`` (``index``, ``dist``, ``gx``, ``gy`` per rank) equals the
    float64 brute force exactly (ties broken by index), holds cKDTree's neighbour sets (cases
    without ties), and its distances and gradients equal single-process autograd's."""
    g = gathered(case, P)
    k = case["k"]
    index = np.concatenate([r["index"] for r in per_rank])
    want = oracle_knn(g.x, g.queries, k, exclude_self=g.exclude_self)
    np.testing.assert_array_equal(index, want, err_msg=f"case {case}")
    if case.get("kind", "uniform") != "dupes":  # cKDTree sets (no ties to break)
        _, ref = cKDTree(g.x).query(g.queries, k=k + int(g.exclude_self))
        ref = np.asarray(ref).reshape(g.queries.shape[0], -1)
        if g.exclude_self:
            ref = ref[:, 1:]
        assert all(set(a) == set(b) for a, b in zip(index.tolist(), ref.tolist()))
    w = full_weights([r["dist"].shape for r in per_rank])
    assert_grads_match(per_rank, *knn_grads(g.x, g.y, want, w))
