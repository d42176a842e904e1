"""Single-process oracles on the gathered (stored-order) data of a test case."""

from __future__ import annotations

import numpy as np
import torch

from tests.ops._data import cloud, layout


def full(case: dict, P: int, which: str = "x") -> np.ndarray:
    sizes = case[f"{which}_sizes"]
    pts = cloud(sum(sizes), case.get("kind", "uniform"), seed=case.get("seed", 0) + (which == "y"))
    method = case.get("method", "slab")
    part = layout(pts, sizes if method in ("slab", "random") else None, method, P)
    return part.apply(pts)


def full_weights(shapes: list[tuple], dtype=torch.float64) -> torch.Tensor:
    from tests.ops._fns import _weights

    return torch.cat([_weights(s, r) for r, s in enumerate(shapes)])


def knn_grads(x: np.ndarray, y: np.ndarray | None, index: np.ndarray, w: torch.Tensor):
    xt = torch.tensor(x, requires_grad=True)
    yt = xt if y is None else torch.tensor(y, requires_grad=True)
    d = torch.linalg.vector_norm(yt[:, None, :] - xt[torch.as_tensor(index)], dim=-1)
    (d * w).sum().backward()
    return d.detach().numpy(), xt.grad.numpy(), None if y is None else yt.grad.numpy()
