"""Bounding regions of shards and the pure "who sends what" planning of the neighbour ops.

A rank's region is up to ``nboxes`` axis-aligned boxes: its rows, in stored (partition) order,
split into that many contiguous runs, one box around each run, half of the cuts at the
largest jumps between consecutive rows. Stored order follows the partitioner's locality order
(space-filling curve, RCB leaves, ...), so the runs are compact even when a whole shard is not
(Morton chunks are often disconnected).

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
    "near_ranks_dense",
    "box_mindist2",
    "knn_bound_from_boxes",
    "knn_forward_mask",
    "near_ranks",
    "radius_send_mask",
    "run_boxes",
    "shard_boxes",
]

# (point, box, coordinate) triples processed at once when comparing points with all boxes
_WORK = 1 << 22
#: consecutive rows per run in the run-then-row reach test of :func:`near_ranks`
_RUN = 1024
# slack on squared reach tests between a run's box and a box (float64 rounding): a superset
# of pairs is harmless, the row-by-box test decides
_SLACK = 1e-9
#: rows per slice when looking for the longest steps between consecutive rows
_STEP_ROWS = 1 << 18


def _chunk(boxes: torch.Tensor) -> int:
    nb = boxes.reshape(-1, boxes.shape[-1]).shape[0]
    return max(1, _WORK // max(1, nb * boxes.shape[-1]))


def shard_boxes(x: torch.Tensor, nboxes: int) -> torch.Tensor:
    """Boxes around ``nboxes`` contiguous runs of ``x``'s rows.

    Half the cuts (rounded down) fall at the largest jumps between consecutive rows, the rest
    split the rows evenly. A space-filling curve leaves a patch and comes back elsewhere: a
    run across such a jump would span the gap, one box reaching far into other ranks'
    regions. Cutting at the jumps keeps every box around one patch. All on the device, no
    host sync (cuts that coincide leave empty runs).

    Parameters
    ----------
    x : Tensor of shape (n, d)
    nboxes : int
        Number of runs (>= 1); empty runs give empty boxes.

    Returns
    -------
    Tensor of shape (nboxes, 2 * d + 1), float64
        ``[lo (d), hi (d), count]`` per box; an empty box has ``lo = +inf, hi = -inf, count = 0``.
    """
    n, d = x.shape
    dev = x.device
    xd = x.detach()  # min / max are exact in x's dtype: no float64 copy of a large shard
    out = torch.empty((nboxes, 2 * d + 1), dtype=torch.float64, device=dev)
    out[:, :d].fill_(float("inf"))
    out[:, d : 2 * d].fill_(float("-inf"))
    out[:, 2 * d].fill_(0)
    if n == 0:
        return out
    cuts = _cuts(xd, nboxes)  # (nboxes - 1,) sorted row offsets in [0, n]
    run = torch.searchsorted(cuts, torch.arange(n, device=dev), right=True)
    idx = run[:, None].expand(n, d)
    lo = torch.full((nboxes, d), float("inf"), dtype=xd.dtype, device=dev)
    hi = torch.full((nboxes, d), float("-inf"), dtype=xd.dtype, device=dev)
    out[:, :d] = lo.scatter_reduce(0, idx, xd, "amin").double()
    out[:, d : 2 * d] = hi.scatter_reduce(0, idx, xd, "amax").double()
    out[:, 2 * d] = torch.zeros(nboxes, dtype=torch.float64, device=dev).index_add_(
        0, run, torch.ones(n, dtype=torch.float64, device=dev))
    return out


def _cuts(x: torch.Tensor, nboxes: int) -> torch.Tensor:
    """The ``nboxes - 1`` inner cuts (sorted, on the device): after the ``nboxes // 2``
    longest steps between consecutive rows, and ``nboxes - njump`` even runs."""
    n = x.shape[0]
    dev = x.device
    njump = min(nboxes // 2, max(0, n - 1))
    parts = []
    if njump:  # the longest steps, found in slices of rows (no temporaries of the shard's size)
        vals, rows = [], []
        for a in range(0, n - 1, _STEP_ROWS):
            b = min(a + _STEP_ROWS, n - 1)
            step = torch.linalg.vector_norm((x[a + 1 : b + 1] - x[a:b]).float(), dim=1)
            v, i = torch.topk(step, min(njump, b - a))
            vals.append(v)
            rows.append(i + a)
        v, i = torch.cat(vals), torch.cat(rows)
        parts.append(i[torch.topk(v, njump).indices] + 1)
    even = nboxes - njump
    parts.append(torch.arange(1, even, device=dev) * n // even)
    return torch.sort(torch.cat(parts)).values


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
    return near_ranks(y, bound2, boxes, rank), bound2


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
    lim = (float(r) * (1 + 1e-9)) ** 2
    reach2 = torch.full((x.shape[0],), lim, dtype=torch.float64, device=x.device)
    return near_ranks(x, reach2, boxes, rank)


def near_ranks(y: torch.Tensor, reach2: torch.Tensor, boxes: torch.Tensor, rank: int
               ) -> torch.Tensor:
    """``mask[i, q]``: some box of rank ``q != rank`` lies within ``reach2[i]`` (squared,
    ``<=``) of row ``y[i]``; never ``q == rank``.

    Rows are taken in runs of ``_RUN`` consecutive rows: a box farther from a run's bounding
    box than the run's largest reach (with a float64 slack) is skipped for all its rows, and
    only the (run, box) pairs left are tested row by row. The result is the plain row-by-box
    test's, but its cost follows the rows near other ranks, not all rows times all boxes:
    interior runs of a spatially ordered shard reach no other rank's box.

    Parameters
    ----------
    y : Tensor of shape (m, d)
    reach2 : Tensor of shape (m,), float64
    boxes : Tensor of shape (P, B, 2 * d + 1)
        Every rank's boxes (this rank's are ignored).
    rank : int
    """
    P, B, _ = boxes.shape
    m = y.shape[0]
    mask = torch.zeros((m, P), dtype=torch.bool, device=y.device)
    others = [q for q in range(P) if q != rank]
    if m == 0 or not others:
        return mask
    flat = boxes[others].reshape(len(others) * B, -1)
    owner = torch.tensor(others, device=y.device).repeat_interleave(B)
    keep = flat[:, -1] > 0  # empty boxes reach nothing
    flat, owner = flat[keep], owner[keep]
    if flat.shape[0] == 0:
        return mask
    d = y.shape[1]
    yd = y.detach().double()
    r2 = reach2.detach().double()
    rlo, rhi, rr = run_boxes(yd, r2)
    runs = rlo.shape[0]
    lo, hi = flat[:, :d], flat[:, d : 2 * d]
    step = max(1, _WORK // max(1, flat.shape[0] * d))
    for s in range(0, runs, step):  # (run, box) pairs within reach: (step, nb, d) temps
        gap = torch.maximum(lo[None] - rhi[s : s + step, None], rlo[s : s + step, None] - hi[None])
        near = (gap.clamp_min(0).pow(2).sum(-1) <= rr[s : s + step, None])  # (step, nb)
        for j in torch.nonzero(near.any(1)).flatten().tolist():
            a = (s + j) * _RUN
            b = min(a + _RUN, m)
            cand = torch.nonzero(near[j]).flatten()
            hit = box_mindist2(yd[a:b], flat[cand]) <= r2[a:b, None]  # (rows, c)
            got = torch.zeros((b - a, P), dtype=torch.float64, device=y.device)
            got.index_add_(1, owner[cand], hit.double())
            mask[a:b] = got > 0
    return mask


def near_ranks_dense(y: torch.Tensor, reach2: torch.Tensor, boxes: torch.Tensor, rank: int
                     ) -> torch.Tensor:
    """:func:`near_ranks` (the same mask) as one row-by-box test over all boxes, in chunks of
    rows: more arithmetic, no host sync and no Python loop over the data (the device path).
    """
    P, B, _ = boxes.shape
    m = y.shape[0]
    dev = y.device
    keep_rank = torch.arange(P, device=dev) != rank
    mask = torch.zeros((m, P), dtype=torch.bool, device=dev)
    if m == 0 or P == 1:
        return mask
    flat = boxes.reshape(P * B, -1)
    yd = y.detach().double()
    r2 = reach2.detach().double().expand(m)
    step = _chunk(flat)
    for s in range(0, m, step):
        hit = box_mindist2(yd[s : s + step], flat) <= r2[s : s + step, None]  # (rows, P*B)
        hit &= flat[None, :, -1] > 0  # empty boxes reach nothing
        mask[s : s + step] = hit.reshape(-1, P, B).any(2) & keep_rank
    return mask


def run_boxes(q: torch.Tensor, reach2: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Box (lo, hi) and largest reach (times ``1 + _SLACK``) of every run of ``_RUN``
    consecutive rows of ``q`` (m >= 1 rows, float64; ``reach2`` of shape (m,) or (1,)).
    The last run is padded with its last row, which changes neither its box nor its reach."""
    m = q.shape[0]
    b2 = reach2.expand(m) if reach2.numel() == 1 else reach2
    runs = -(-m // _RUN)
    pad = runs * _RUN - m
    if pad:
        q = torch.cat([q, q[-1:].expand(pad, -1)])
        b2 = torch.cat([b2, b2[-1:].expand(pad)])
    qr = q.reshape(runs, _RUN, -1)
    return qr.amin(1), qr.amax(1), b2.reshape(runs, _RUN).amax(1) * (1 + _SLACK)
