"""A rank's points as blocks of consecutive rows, each with its bounding box, searched through
small trees built over just the blocks a set of queries can reach.

This is what keeps :func:`meshshard.ops.knn_chunks` memory-bounded: there is no tree over the
whole shard (that is ~40 bytes per point); a query chunk searches the blocks whose box lies
within its bound. The answer is exact whatever the row order; the memory is bounded when
consecutive rows are close in space (a chunk then reaches a few blocks), as they are in mesh
files and after a space-filling-curve sort.
"""

from __future__ import annotations

import math

import torch

from meshshard.ops import kernels

__all__ = ["RowBlocks", "box_gap2"]

# slack on squared reach tests between boxes (float64 rounding): a superset is harmless
_SLACK = 1e-9


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
    """Blocks of ``size`` consecutive rows of ``x`` (n, d) with their float64 boxes.

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
        nb = math.ceil(n / size)
        lo = torch.empty((nb, d), dtype=torch.float64, device=x.device)
        hi = torch.empty((nb, d), dtype=torch.float64, device=x.device)
        xd = x.detach()
        for j in range(nb):  # min / max are exact in x's dtype
            seg = xd[j * size : (j + 1) * size]
            lo[j], hi[j] = seg.amin(0).double(), seg.amax(0).double()
        self.lo, self.hi = lo, hi
        self.searched = 0  # rows put into trees so far (a cost counter)

    def _blocks_near(self, q: torch.Tensor, bound2: torch.Tensor) -> torch.Tensor:
        """Mask of the blocks within ``max(bound2)`` of the box around ``q`` (q non-empty)."""
        qd = q.detach().double()
        qlo, qhi = qd.amin(0), qd.amax(0)
        gap = torch.maximum(self.lo - qhi, qlo - self.hi).clamp_min(0)
        return (gap * gap).sum(1) <= float(bound2.max()) * (1 + _SLACK)

    def _rows(self, blocks: torch.Tensor) -> torch.Tensor:
        n, s, dev = self.x.shape[0], self.size, self.x.device
        parts = [torch.arange(j * s, min((j + 1) * s, n), device=dev)
                 for j in torch.nonzero(blocks).flatten().tolist()]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=dev)

    def rows_near(self, q: torch.Tensor, bound2: torch.Tensor) -> torch.Tensor:
        """Sorted local rows of every block within ``max(bound2)`` of the box around ``q``.

        Every row within ``bound2[i]`` (squared) of some query ``q[i]`` is among them.
        """
        if q.shape[0] == 0 or self.lo.shape[0] == 0:
            return torch.empty(0, dtype=torch.int64, device=self.x.device)
        return self._rows(self._blocks_near(q, bound2))

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

    def local_knn(self, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact k nearest rows of this shard for queries ``q`` that lie close together:
        first among the blocks the queries' box touches, which bounds each query's k-th
        distance; then the queries whose bound reaches a further block are searched again
        among every block their bounds reach."""
        if q.shape[0] == 0 or self.lo.shape[0] == 0:
            return kernels.knn(self.x[:0], q, k, backend=self.backend)
        first = self._blocks_near(q, torch.zeros(1, dtype=torch.float64))
        d2, ii = self.knn(q, k, self._rows(first))
        bound2 = d2[:, k - 1]  # inf (too few rows) reaches every block
        further = self._blocks_near(q, bound2) & ~first
        if bool(further.any()):
            gap = box_gap2(q, self.lo[further], self.hi[further])  # (m, b)
            again = torch.nonzero((gap <= bound2[:, None] * (1 + _SLACK)).any(1)).flatten()
            if again.numel():
                qa = q[again]
                d2[again], ii[again] = self.knn(qa, k, self.rows_near(qa, bound2[again]))
        return d2, ii

    def answer(self, queries: torch.Tensor, counts: list[int], k: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`meshshard.ops._knn_merge.answer_knn_queries` for forwarded queries, each
        source rank's (``counts``, in order) searched among the blocks its bounds reach."""
        d = queries.shape[1] - 1
        d2s, iis = [], []
        start = 0
        for c in counts:
            qs = queries[start : start + c]
            start += c
            if c:
                d2, ii = self.knn(qs[:, :d], k, self.rows_near(qs[:, :d], qs[:, d]))
                d2s.append(d2)
                iis.append(ii)
        if not d2s:
            e = torch.empty(0, dtype=torch.int64, device=queries.device)
            return e, e, torch.empty(0, dtype=torch.float64, device=queries.device), e
        rd2, ri = torch.cat(d2s), torch.cat(iis)
        ok = (ri >= 0) & (rd2 <= queries[:, d:])  # <=: a tie with the bound may win by index
        jr, jc = torch.nonzero(ok, as_tuple=True)
        return jr, jc, rd2[jr, jc], ri[jr, jc]
