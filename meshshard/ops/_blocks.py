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

__all__ = ["RowBlocks"]

# slack on squared reach tests between boxes (float64 rounding): a superset is harmless
_SLACK = 1e-9


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

    def rows_near(self, q: torch.Tensor, bound2: torch.Tensor) -> torch.Tensor:
        """Sorted local rows of every block within ``max(bound2)`` of the box around ``q``.

        Every row within ``bound2[i]`` (squared) of some query ``q[i]`` is among them.
        """
        dev = self.x.device
        if q.shape[0] == 0 or self.lo.shape[0] == 0:
            return torch.empty(0, dtype=torch.int64, device=dev)
        qd = q.detach().double()
        qlo, qhi = qd.amin(0), qd.amax(0)
        gap = torch.maximum(self.lo - qhi, qlo - self.hi).clamp_min(0)
        reach = float(bound2.max())
        near = (gap * gap).sum(1) <= reach * (1 + _SLACK)
        n, s = self.x.shape[0], self.size
        parts = [torch.arange(j * s, min((j + 1) * s, n), device=dev)
                 for j in torch.nonzero(near).flatten().tolist()]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=dev)

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
        distance, then, if that bound reaches more blocks, among all of those."""
        zero = torch.zeros(q.shape[0], dtype=torch.float64, device=q.device)
        rows = self.rows_near(q, zero)
        d2, ii = self.knn(q, k, rows)
        if q.shape[0] == 0:
            return d2, ii
        more = self.rows_near(q, d2[:, k - 1])  # inf (too few rows) reaches every block
        if more.numel() > rows.numel():  # the same box with a larger reach: a superset
            d2, ii = self.knn(q, k, more)
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
