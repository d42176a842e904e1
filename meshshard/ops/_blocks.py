"""A rank's points as blocks of consecutive rows, each with its bounding box, searched through
small trees built over just the blocks a set of queries can reach.

This is what keeps :func:`meshshard.ops.knn_chunks` memory-bounded: there is no tree over the
whole shard (that is ~40 bytes per point); a query chunk searches the blocks whose box lies
within its bound. The answer is exact whatever the row order; the memory is bounded when
consecutive rows are close in space (a chunk then reaches a few blocks), as they are in mesh
files and after a space-filling-curve sort.
"""

from __future__ import annotations

import torch

from meshshard.ops import kernels
from meshshard.ops._regions import _SLACK, run_boxes

__all__ = ["RowBlocks", "box_gap2"]

#: a step between consecutive rows this many times its block's median step cuts the block
_JUMP = 16.0
#: at most this many such cuts per block (the longest steps)
_MAX_CUTS = 7


def box_gap2(q: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Squared distance (float64) from each query (m, d) to each box ``[lo, hi]`` (b, d),
    in steps of queries: (m, b)."""
    qd = q.detach().double()
    out = torch.empty((qd.shape[0], lo.shape[0]), dtype=torch.float64, device=q.device)
    step = max(1, (1 << 22) // max(1, lo.shape[0] * qd.shape[1]))
    for a in range(0, qd.shape[0], step):
        p = qd[a : a + step, None, :]
        gap = torch.maximum(lo[None] - p, p - hi[None]).clamp_min(0)
        out[a : a + step] = (gap * gap).sum(-1)
    return out


class RowBlocks:
    """Pieces of at most ``size`` consecutive rows of ``x`` (n, d) with their float64 boxes.

    The rows are cut every ``size`` rows, and inside each such block also at its jumps: steps
    between consecutive rows longer than ``_JUMP`` times the block's median step (at most
    ``_MAX_CUTS`` of them, the longest). A space-filling curve leaves a patch and comes back
    elsewhere; a box across the jump would span the gap and be reached by queries on both
    sides and in between.

    Parameters
    ----------
    x : Tensor of shape (n, d)
    size : int
        Rows per block (>= 1).
    backend : str
        Kernel for the per-query-set trees (:mod:`meshshard.ops.kernels`).
    """

    def __init__(self, x: torch.Tensor, size: int, *, backend: str) -> None:
        self.x, self.size, self.backend = x, size, backend
        n, d = x.shape
        xd = x.detach()
        starts: list[int] = []
        for a in range(0, n, size):
            starts.append(a)
            starts.extend(a + c for c in _jumps(xd[a : a + size]))
        self.start = starts
        self.stop = [*starts[1:], n] if starts else []
        lo = torch.empty((len(starts), d), dtype=torch.float64, device=x.device)
        hi = torch.empty((len(starts), d), dtype=torch.float64, device=x.device)
        for j, (a, b) in enumerate(zip(self.start, self.stop, strict=True)):
            seg = xd[a:b]  # min / max are exact in x's dtype
            lo[j], hi[j] = seg.amin(0).double(), seg.amax(0).double()
        self.lo, self.hi = lo, hi
        self.searched = 0  # rows put into trees so far (a cost counter)

    def _blocks_near(self, q: torch.Tensor, bound2: torch.Tensor) -> torch.Tensor:
        """Mask of the blocks within reach of ``q`` (non-empty): ``q`` is cut into runs of
        ``_RUN`` consecutive rows, and a block is kept when it lies within a run's largest
        bound of that run's box. A chunk of consecutive rows along a space-filling curve may
        lie in a few separate patches (the curve leaves the surface and comes back); one box
        around all of it would span the gap and reach every block in between, more of them
        the more blocks the shard has. The runs' boxes follow the patches."""
        qd = q.detach().double()
        qlo, qhi, reach = run_boxes(qd, bound2.detach().double())
        runs = qlo.shape[0]
        near = torch.zeros(self.lo.shape[0], dtype=torch.bool, device=q.device)
        step = max(1, (1 << 20) // max(1, runs * qd.shape[1]))
        for j in range(0, self.lo.shape[0], step):  # blocks in steps: (step, runs, d) temps
            lo, hi = self.lo[j : j + step, None], self.hi[j : j + step, None]
            gap = torch.maximum(lo - qhi[None], qlo[None] - hi).clamp_min(0)
            near[j : j + step] = ((gap * gap).sum(-1) <= reach[None]).any(1)
        return near

    def _rows(self, blocks: torch.Tensor) -> torch.Tensor:
        parts = [self._block_rows(j) for j in torch.nonzero(blocks).flatten().tolist()]
        if parts:
            return torch.cat(parts)
        return torch.empty(0, dtype=torch.int64, device=self.x.device)

    def knn(self, q: torch.Tensor, k: int, rows: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """k nearest of ``q`` among the local ``rows`` (sorted): (d2, local row), ``inf`` /
        ``-1`` padded, ties by the lower row (rows are increasing, so the kernel's tie order is
        the rows' order)."""
        self.searched += int(rows.numel())
        d2, ii = kernels.knn(self.x[rows], q, k, backend=self.backend)
        if rows.numel() == 0:  # all padding
            return d2, ii
        return d2, torch.where(ii >= 0, rows[ii.clamp_min(0)], -1)

    def _block_rows(self, j: int) -> torch.Tensor:
        return torch.arange(self.start[j], self.stop[j], device=self.x.device)

    def _search_blocks(self, q: torch.Tensor, k: int, blocks: torch.Tensor,
                       bound2: torch.Tensor, d2: torch.Tensor, ii: torch.Tensor) -> None:
        """Improve ``(d2, ii)`` (m, k) in place with the rows of ``blocks`` (a mask): each
        block is searched alone, by the queries whose ``bound2`` reaches its box, and merged.
        One block's tree at a time, however many blocks the queries reach (a large set of
        blocks, when a few queries have long bounds, would otherwise be one large tree)."""
        for j in torch.nonzero(blocks).flatten().tolist():
            gap = box_gap2(q, self.lo[j : j + 1], self.hi[j : j + 1])[:, 0]
            qi = torch.nonzero(gap <= bound2 * (1 + _SLACK)).flatten()
            if qi.numel() == 0:
                continue
            bd2, bii = self.knn(q[qi], k, self._block_rows(j))
            d2[qi], ii[qi] = _merge(d2[qi], ii[qi], bd2, bii, k)

    def local_knn(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact k nearest rows of this shard for queries ``q`` that lie close together:
        first among the blocks the queries' runs touch, which bounds each query's k-th
        distance; then each further block their bounds reach is searched, block by block, by
        the queries whose bound reaches it, and the answers merged (ties by the lower row)."""
        if q.shape[0] == 0 or self.lo.shape[0] == 0:
            return kernels.knn(self.x[:0], q, k, backend=self.backend)
        first = self._blocks_near(q, torch.zeros(1, dtype=torch.float64))
        d2, ii = self.knn(q, k, self._rows(first))
        bound2 = d2[:, k - 1].clone()  # inf (too few rows) reaches every block
        further = self._blocks_near(q, bound2) & ~first
        if bool(further.any()):
            self._search_blocks(q, k, further, bound2, d2, ii)
        return d2, ii

    def answer(self, queries: torch.Tensor, counts: list[int], k: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`meshshard.ops._knn_merge.answer_knn_queries` for forwarded queries, each
        source rank's (``counts``, in order) searched among the blocks its bounds reach."""
        d = queries.shape[1] - 1
        d2s, iis = [], []
        start = 0
        for c in counts:
            qs = queries[start : start + c]
            start += c
            if c:
                q, b2 = qs[:, :d], qs[:, d]
                d2 = torch.full((c, k), float("inf"), dtype=torch.float64, device=q.device)
                ii = torch.full((c, k), -1, dtype=torch.int64, device=q.device)
                if self.lo.shape[0]:
                    self._search_blocks(q, k, self._blocks_near(q, b2), b2, d2, ii)
                d2s.append(d2)
                iis.append(ii)
        if not d2s:
            return (torch.empty((0, k), dtype=torch.float64, device=queries.device),
                    torch.empty((0, k), dtype=torch.int64, device=queries.device))
        rd2, ri = torch.cat(d2s), torch.cat(iis)
        ok = (ri >= 0) & (rd2 <= queries[:, d:])  # <=: a tie with the bound may win by index
        return torch.where(ok, rd2, float("inf")), torch.where(ok, ri, -1)


def _jumps(seg: torch.Tensor) -> list[int]:
    """Sorted offsets in ``seg`` (rows of one block) that start a new piece: after steps longer
    than ``_JUMP`` times the median step, the ``_MAX_CUTS`` longest of them."""
    if seg.shape[0] < 3:
        return []
    step = torch.linalg.vector_norm((seg[1:] - seg[:-1]).float(), dim=1)
    big = torch.nonzero(step > _JUMP * step.median()).flatten()
    if big.numel() > _MAX_CUTS:
        big = big[torch.topk(step[big], _MAX_CUTS).indices]
    return sorted((big + 1).tolist())


def _merge(d2a: torch.Tensor, ia: torch.Tensor, d2b: torch.Tensor, ib: torch.Tensor, k: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of two answers over disjoint rows, ascending by (distance, row); padding
    (``inf``, ``-1``) last."""
    d2 = torch.cat([d2a, d2b], 1)
    ii = torch.cat([ia, ib], 1)
    key = torch.where(ii >= 0, ii, torch.iinfo(torch.int64).max)
    o = torch.argsort(key, dim=1, stable=True)
    o = o.gather(1, torch.argsort(d2.gather(1, o), dim=1, stable=True))[:, :k]
    return d2.gather(1, o), ii.gather(1, o)
