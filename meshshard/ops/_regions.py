"""Bounding regions of shards and the pure "who sends what" planning of the neighbour ops.

A rank's region is up to ``nboxes`` axis-aligned boxes: its rows, in stored (partition) order,
split into that many contiguous runs, one box around each run. Stored order follows the
partitioner's locality order (space-filling curve, RCB leaves, ...), so the runs are compact
even when a whole shard is not (Morton chunks are often disconnected).

The functions here take plain tensors and never communicate; the distributed ops call them
with the all-gathered boxes, and ``benchmarks/bench_ops.py`` calls the same functions on P
shards in one process to count traffic at rank counts the machine cannot run.

All geometry is float64. ``box_mindist2`` never exceeds the float64 squared distance of
:func:`meshshard.ops.kernels.sqdist` to any point in the box and ``box_maxdist2`` is never
below it (rounding is monotone), so pruning with them is exact.
"""

from __future__ import annotations

import torch

__all__ = [
    "box_maxdist2",
    "box_mindist2",
    "knn_bound_from_boxes",
    "knn_forward_mask",
    "radius_send_mask",
    "shard_boxes",
]

# (point, box, coordinate) triples processed at once when comparing points with all boxes
_WORK = 1 << 22


def _chunk(boxes: torch.Tensor) -> int:
    nb = boxes.reshape(-1, boxes.shape[-1]).shape[0]
    return max(1, _WORK // max(1, nb * boxes.shape[-1]))


def shard_boxes(x: torch.Tensor, nboxes: int) -> torch.Tensor:
    """Boxes around ``nboxes`` contiguous runs of ``x``'s rows.

    Parameters
    ----------
    x : Tensor of shape (n, d)
    nboxes : int
        Number of runs (>= 1); runs are as even as possible; empty runs give empty boxes.

    Returns
    -------
    Tensor of shape (nboxes, 2 * d + 1), float64
        ``[lo (d), hi (d), count]`` per box; an empty box has ``lo = +inf, hi = -inf, count = 0``.
    """
    n, d = x.shape
    xd = x.detach()  # min / max are exact in x's dtype: no float64 copy of a large shard
    out = torch.empty((nboxes, 2 * d + 1), dtype=torch.float64, device=x.device)
    out[:, :d] = float("inf")
    out[:, d : 2 * d] = float("-inf")
    out[:, 2 * d] = 0
    bounds = [(i * n) // nboxes for i in range(nboxes + 1)]
    for b in range(nboxes):
        lo, hi = bounds[b], bounds[b + 1]
        if hi > lo:
            seg = xd[lo:hi]
            out[b, :d] = seg.amin(0).double()
            out[b, d : 2 * d] = seg.amax(0).double()
            out[b, 2 * d] = hi - lo
    return out


def _split(boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = (boxes.shape[-1] - 1) // 2
    return boxes[..., :d], boxes[..., d : 2 * d], boxes[..., 2 * d]


def box_mindist2(y: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Squared distance from each point to each box (0 inside; inf for empty boxes).

    Parameters
    ----------
    y : Tensor of shape (m, d)
    boxes : Tensor of shape (B, 2 * d + 1)

    Returns
    -------
    Tensor of shape (m, B), float64
    """
    lo, hi, _ = _split(boxes)
    yd = y.detach().double()[:, None, :]
    gap = torch.clamp(lo[None] - yd, min=0) + torch.clamp(yd - hi[None], min=0)
    return gap.pow(2).sum(-1)


def box_maxdist2(y: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Squared distance from each point to the farthest corner of each box (m, B), float64."""
    lo, hi, _ = _split(boxes)
    yd = y.detach().double()[:, None, :]
    far = torch.maximum((yd - lo[None]).pow(2), (yd - hi[None]).pow(2))
    return far.sum(-1)


def knn_bound_from_boxes(y: torch.Tensor, boxes: torch.Tensor, k: int) -> torch.Tensor:
    """An upper bound on every query's squared k-th neighbour distance from boxes alone.

    Sort all boxes by their farthest-corner distance; the first distance at which the boxes
    passed hold ``k`` points bounds the k-th neighbour distance. Used for queries whose own
    shard holds fewer than ``k`` points.

    Parameters
    ----------
    y : Tensor of shape (m, d)
    boxes : Tensor of shape (B, 2 * d + 1)
        All boxes of all ranks (flattened).

    Returns
    -------
    Tensor of shape (m,), float64 (``inf`` if all boxes together hold fewer than ``k`` points).
    """
    _, _, counts = _split(boxes)
    out = torch.full((y.shape[0],), float("inf"), dtype=torch.float64, device=y.device)
    if y.shape[0] == 0:
        return out
    step = _chunk(boxes)
    for s in range(0, y.shape[0], step):
        far = box_maxdist2(y[s : s + step], boxes)
        far = torch.where(counts[None] > 0, far, float("inf"))
        far, o = torch.sort(far, dim=1)
        cum = torch.cumsum(counts[o], dim=1)
        enough = cum >= k
        has = enough.any(1)
        first = torch.argmax(enough.to(torch.int8), dim=1)
        val = far.gather(1, first[:, None]).squeeze(1)
        out[s : s + step] = torch.where(has, val, float("inf"))
    return out


def knn_forward_mask(
    y: torch.Tensor, bound2: torch.Tensor, boxes: torch.Tensor, rank: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which ranks each query must be forwarded to in the second kNN phase.

    Parameters
    ----------
    y : Tensor of shape (m, d)
        Queries of ``rank``.
    bound2 : Tensor of shape (m,), float64
        Squared k-th distance found locally (``inf`` when the local shard had < k points).
    boxes : Tensor of shape (P, B, 2 * d + 1)
        Every rank's boxes.
    rank : int
        The querying rank (never forwarded to itself).

    Returns
    -------
    mask : Tensor of shape (m, P), bool
        ``mask[i, q]``: some box of rank ``q`` lies within the bound of query ``i``
        (``<=``, so points tied with the k-th distance are seen and ties break by index).
    bound2 : Tensor of shape (m,), float64
        The bound used (``inf`` entries replaced by :func:`knn_bound_from_boxes`).
    """
    P, B, _ = boxes.shape
    m = y.shape[0]
    mask = torch.zeros((m, P), dtype=torch.bool, device=y.device)
    if m == 0:
        return mask, bound2
    bound2 = bound2.clone()
    inf_rows = torch.isinf(bound2)
    if inf_rows.any():
        bound2[inf_rows] = knn_bound_from_boxes(y[inf_rows], boxes.reshape(P * B, -1), k)
    flat = boxes.reshape(P * B, -1)
    step = _chunk(flat)
    for s in range(0, m, step):
        near = box_mindist2(y[s : s + step], flat).reshape(-1, P, B).amin(-1)
        mask[s : s + step] = near <= bound2[s : s + step, None]
    mask[:, rank] = False
    return mask, bound2


def radius_send_mask(x: torch.Tensor, r: float, boxes: torch.Tensor, rank: int) -> torch.Tensor:
    """Which of this rank's points every other rank's queries may need for a radius query.

    Parameters
    ----------
    x : Tensor of shape (n, d)
        This rank's points.
    r : float
    boxes : Tensor of shape (P, B, 2 * d + 1)
        Every rank's boxes around its *queries*.
    rank : int

    Returns
    -------
    Tensor of shape (n, P), bool
        ``mask[j, q]``: point ``j`` lies within ``r`` of some query box of rank ``q``.
    """
    P, B, _ = boxes.shape
    n = x.shape[0]
    mask = torch.zeros((n, P), dtype=torch.bool, device=x.device)
    lim = (float(r) * (1 + 1e-9)) ** 2
    flat = boxes.reshape(P * B, -1)
    step = _chunk(flat)
    for s in range(0, n, step):
        near = box_mindist2(x[s : s + step], flat).reshape(-1, P, B).amin(-1)
        mask[s : s + step] = near <= lim
    mask[:, rank] = False
    return mask
