"""A uniform-grid cell list on any torch device: exact kNN and ball queries without an
O(n * m) scan and without a Python loop per tile or per query.

Build: points are hashed to the cells of a regular grid (cell size from the density, or the
radius for ball queries), sorted by cell (a stable sort, so rows stay in index order inside a
cell), and counted; a d-dimensional prefix sum of the counts gives the number of points in any
box of cells with ``2**d`` look-ups.

Query: a box of cells per query (``x`` is the fastest axis, so each row of cells along ``x`` is
one contiguous run of the sorted points); every (query, candidate) pair of a chunk of queries
is laid out in one padded matrix by a batched ``searchsorted`` over the runs' lengths; distances
are float64 (:func:`meshshard.ops.kernels.sqdist`'s formula); selection is a ``topk`` with ties
broken by index.

- kNN: the smallest box (1, 2, 4, ... cells around the query's cell) holding ``k`` points gives
  an upper bound ``D`` on the k-th distance; a query whose box reaches farther than ``D`` on
  every side is done, the others search the cells within ``D`` (a second pass). Exact on any
  layout, clustered or not.
- Ball query: the cells within ``r``; ``radius_padded`` keeps the closest ``W`` (static
  shape), ``radius`` returns all, in CSR.

Host syncs: the grid's shape needs the points' bounds on the host (one read-back unless
``bounds=`` is given); each query pass reads back its chunks' largest candidate counts (one
read-back per pass; kNN makes two passes, a capped ball query one, the CSR ball query one more
per chunk for the compaction). Everything else stays on the device.
"""

from __future__ import annotations

import math

import torch

__all__ = ["CellIndex"]

#: (query, candidate) pairs per chunk of work
_PAIRS = 1 << 21
#: queries per chunk when sizing (one read-back covers all chunks)
_QCHUNK = 1 << 14
#: grid cells allowed per point (and at least this many in all)
_CELLS_PER_POINT, _MIN_CELLS = 2, 1 << 12
_BIG = torch.iinfo(torch.int64).max
_SLACK = 1e-9
#: pass 1 of kNN searches a ball expected to hold this many times k points
_AHEAD = 1.5


def _sqdist(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (y - x).pow(2).sum(-1)


class CellIndex:
    """The points ``x`` hashed into a uniform grid, for repeated exact kNN / ball queries.

    Parameters
    ----------
    x : Tensor of shape (n, d), floating, any device, ``1 <= d <= 4``
    cell : float, optional
        Cell size (a ball query's radius is a good one). Default: from the density, about
        ``per_cell`` points per cell of the bounding box.
    per_cell : float
        Target points per cell of the bounding box when ``cell`` is not given (measured with
        k=16: 0.5 beat 2 on uniform and on clustered clouds; at most ``max(2 n, 4096)`` cells
        are made, which caps smaller values).
    bounds : (lo, hi) sequences of d floats, optional
        A box holding every point; saves the read-back of the points' bounds.
    key : Tensor of shape (n,), int64, optional
        Tie-break order of the points (default: the row index), e.g. global indices.

    Notes
    -----
    Memory: about 40 bytes per point plus 16 bytes per grid cell (at most
    ``max(2 n, 4096)`` cells).
    """

    def __init__(
        self,
        x: torch.Tensor,
        *,
        cell: float | None = None,
        per_cell: float = 0.5,
        bounds: tuple | None = None,
        key: torch.Tensor | None = None,
    ) -> None:
        if x.dim() != 2 or not 1 <= x.shape[1] <= 4:
            msg = f"CellIndex: x must have shape (n, d) with 1 <= d <= 4, got {tuple(x.shape)}"
            raise ValueError(msg)
        n, d = x.shape
        self.n, self.d, self.device = n, d, x.device
        xd = x.detach().double()
        if bounds is None:
            if n:
                lo_hi = torch.stack([xd.amin(0), xd.amax(0)]).tolist()  # host sync: the box
            else:
                lo_hi = [[0.0] * d, [0.0] * d]
        else:
            lo_hi = [[float(v) for v in bounds[0]], [float(v) for v in bounds[1]]]
        lo, hi = lo_hi
        ext = [max(h - lo_, 0.0) for lo_, h in zip(lo, hi, strict=True)]
        cap = max(_MIN_CELLS, _CELLS_PER_POINT * n)
        if cell is None:
            live = [e for e in ext if e > 0]
            h = (math.prod(live) * per_cell / max(n, 1)) ** (1 / len(live)) if live else 1.0
        else:
            h = float(cell)
        h = max(h, max(ext) * 1e-12, 1e-300)

        def dims(h: float) -> list[int]:
            return [int(math.floor(e / h)) + 1 for e in ext]

        while math.prod(dims(h)) > cap:
            h *= 1.25
        self.h, self.lo, self.G = h, lo, dims(h)
        self.ncells = math.prod(self.G)
        self.strides = [math.prod(self.G[:i]) for i in range(d)]  # x (dim 0) fastest
        cid = self._linear(self._cells(xd))
        order = torch.argsort(cid, stable=True)  # within a cell: increasing row
        counts = torch.zeros(self.ncells, dtype=torch.int64, device=self.device)
        counts.index_add_(0, cid, torch.ones_like(cid))
        self.cend = torch.cumsum(counts, 0)
        self.cstart = self.cend - counts
        xs = xd[order]
        self.cols = [xs[:, i].contiguous() for i in range(d)]
        self.order = order
        base = torch.arange(n, device=self.device) if key is None else key.to(self.device)
        self.key = base[order]
        # d-dimensional prefix sums, each axis padded with a leading 0: box counts
        sat = counts.reshape(*reversed(self.G))  # axes (d-1, ..., 0)
        for ax in range(d):
            sat = torch.nn.functional.pad(torch.cumsum(sat, ax), [0, 0] * (d - 1 - ax) + [1, 0])
        self.sat = sat.reshape(-1)
        self.sat_strides = [math.prod(g + 1 for g in self.G[:i]) for i in range(d)]

    # ------------------------------------------------------------------ grid helpers
    def _cells(self, y: torch.Tensor) -> torch.Tensor:
        """Integer cell coordinates (m, d) of float64 points, clamped to the grid."""
        c = torch.empty(y.shape, dtype=torch.int64, device=y.device)
        for i in range(self.d):
            c[:, i] = torch.floor((y[:, i] - self.lo[i]) / self.h).clamp(0, self.G[i] - 1).long()
        return c

    def _linear(self, c: torch.Tensor) -> torch.Tensor:
        out = c[:, 0].clone()
        for i in range(1, self.d):
            out += c[:, i] * self.strides[i]
        return out

    def _box_count(self, clo: torch.Tensor, chi: torch.Tensor) -> torch.Tensor:
        """Points in the cell boxes [clo, chi] (inclusive, (m, d) each)."""
        total = torch.zeros(clo.shape[0], dtype=torch.int64, device=clo.device)
        for corner in range(1 << self.d):
            idx = torch.zeros_like(total)
            neg = 0
            for i in range(self.d):
                if corner >> i & 1:
                    idx += (chi[:, i] + 1) * self.sat_strides[i]
                else:
                    idx += clo[:, i] * self.sat_strides[i]
                    neg += 1
            v = self.sat[idx]
            total += v if neg % 2 == 0 else -v
        return total

    def _range(self, y: torch.Tensor, reach: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell boxes holding every point within ``reach`` (m,) of each query (clamped)."""
        clo = torch.empty(y.shape, dtype=torch.int64, device=y.device)
        chi = torch.empty_like(clo)
        for i in range(self.d):
            f = (y[:, i] - self.lo[i]) / self.h
            rr = reach / self.h
            clo[:, i] = torch.floor(f - rr).clamp(0, self.G[i] - 1).long()
            chi[:, i] = torch.floor(f + rr).clamp(0, self.G[i] - 1).long()
        return clo, chi

    def _around(self, c: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The boxes of cells ``c +- s`` (clamped)."""
        clo = torch.stack([(c[:, i] - s).clamp(0, self.G[i] - 1) for i in range(self.d)], 1)
        chi = torch.stack([(c[:, i] + s).clamp(0, self.G[i] - 1) for i in range(self.d)], 1)
        return clo, chi

    def _margin(self, y: torch.Tensor, clo: torch.Tensor, chi: torch.Tensor) -> torch.Tensor:
        """Distance from each query to the nearest face of its box that has cells beyond it
        (``inf`` when the box covers the grid): every point closer lies in the box."""
        m = torch.full((y.shape[0],), float("inf"), dtype=torch.float64, device=y.device)
        for i in range(self.d):
            f = y[:, i] - self.lo[i]
            left = torch.where(clo[:, i] > 0, f - clo[:, i] * self.h, float("inf"))
            right = torch.where(chi[:, i] < self.G[i] - 1, (chi[:, i] + 1) * self.h - f,
                                float("inf"))
            m = torch.minimum(m, torch.minimum(left, right))
        return m

    def _sizes(self, clo, chi, active=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidates and x-runs per query (0 where not ``active``)."""
        count = self._box_count(clo, chi)
        rows = torch.ones_like(count)
        for i in range(1, self.d):
            rows = rows * (chi[:, i] - clo[:, i] + 1)
        if active is not None:
            count = torch.where(active, count, 0)
            rows = torch.where(active, rows, 0)
        return count, rows

    def _chunks(self, count: torch.Tensor, rows: torch.Tensor) -> list[tuple[int, int, int, int]]:
        """(start, stop, max candidates, max runs) of query chunks: one read-back for all."""
        m = count.shape[0]
        if m == 0:
            return []
        bounds = list(range(0, m, _QCHUNK)) + [m]
        pad = (-m) % _QCHUNK
        cm = torch.nn.functional.pad(count, [0, pad]).reshape(-1, _QCHUNK).amax(1)
        rm = torch.nn.functional.pad(rows, [0, pad]).reshape(-1, _QCHUNK).amax(1)
        sizes = torch.stack([cm, rm], 1).tolist()  # host sync: the chunks' widths
        out = []
        for (a, b), (c, r) in zip(zip(bounds[:-1], bounds[1:]), sizes, strict=True):
            if c == 0:
                continue
            step = max(1, _PAIRS // max(c, r, 1))
            out += [(s, min(s + step, b), c, r) for s in range(a, b, step)]
        return out

    def _candidates(self, clo, chi, count, nrows, C: int, R: int):
        """Padded candidate positions (q, C) into the sorted points, and their validity."""
        q = clo.shape[0]
        dev = clo.device
        r = torch.arange(R, device=dev)
        # the run r of a query: its coordinates along dims 1.. (dim 0 spans the run)
        base = clo[:, 0][:, None].expand(q, R).clone()
        rem = r[None, :].expand(q, R).clone()
        for i in range(1, self.d):
            span = (chi[:, i] - clo[:, i] + 1)[:, None]
            base += (clo[:, i][:, None] + rem % span) * self.strides[i]
            rem = rem.div_(span, rounding_mode="floor")
        last = base + (chi[:, 0] - clo[:, 0])[:, None]
        live = r[None, :] < nrows[:, None]
        start = self.cstart[base.clamp_(0, self.ncells - 1)]
        length = (self.cend[last.clamp_(0, self.ncells - 1)] - start).masked_fill_(~live, 0)
        cum = torch.cumsum(length, 1)
        j = torch.arange(C, device=dev)[None, :].expand(q, C).contiguous()
        run = torch.searchsorted(cum, j, right=True).clamp_(max=R - 1)
        shift = start.sub_(cum).add_(length)  # pos = start + (j - cum + length) in its run
        pos = shift.gather(1, run).add_(j).clamp_(0, max(self.n - 1, 0))
        valid = j < count[:, None]
        return pos, valid

    def _dist(self, y: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """float64 squared distances (q, C) from queries to candidates, as :func:`sqdist`."""
        out = None
        for i in range(self.d):
            t = self.cols[i][pos].sub_(y[:, i : i + 1]).square_()
            out = t if out is None else out.add_(t)
        return out

    def _pass(self, y, clo, chi, active, k: int, r: float | None, exact: bool = True):
        """The k best candidates (by (d2, key)) of every query in its box; (m, k) each, and
        the rows whose k-th place may be tied with a candidate left out (``exact=False``:
        those rows' selection ignored keys at the cut and must be redone).

        Queries are taken in order of their candidate count, so a chunk's padded width fits
        all its queries closely and inactive queries (count 0) cost nothing."""
        m = y.shape[0]
        d2 = torch.full((m, k), float("inf"), dtype=torch.float64, device=y.device)
        pos = torch.full((m, k), -1, dtype=torch.int64, device=y.device)
        tied = torch.zeros(m, dtype=torch.bool, device=y.device)
        count, nrows = self._sizes(clo, chi, active)
        perm = torch.argsort(count)
        y, clo, chi, count, nrows = y[perm], clo[perm], chi[perm], count[perm], nrows[perm]
        for a, b, C, R in self._chunks(count, nrows):
            p, valid = self._candidates(clo[a:b], chi[a:b], count[a:b], nrows[a:b], C, R)
            cd2 = self._dist(y[a:b], p)
            if r is not None:
                valid &= cd2.sqrt() <= r
            cd2.masked_fill_(~valid, float("inf"))
            kk = min(k, C)
            if exact:
                sd, sp = _select(cd2, torch.where(valid, self.key[p], _BIG), p, kk)
            else:
                sd, sp, tie = self._select_fast(cd2, p, kk)
                tied[perm[a:b]] = tie
            rows = perm[a:b]
            d2[rows, :kk] = sd
            pos[rows, :kk] = sp
        return d2, pos, tied

    def _select_fast(self, d2: torch.Tensor, pos: torch.Tensor, k: int):
        """``_select`` without keys at the cut: ``topk`` of the distances, then the k chosen
        sorted by (d2, key); rows with a tie across the cut are flagged."""
        C = d2.shape[1]
        v, i = torch.topk(d2, min(k + 1, C), dim=1, largest=False, sorted=True)
        if C > k:
            tie = (v[:, k - 1] == v[:, k]) & torch.isfinite(v[:, k])
        else:
            tie = torch.zeros(d2.shape[0], dtype=torch.bool, device=d2.device)
        sd, sp = v[:, :k], pos.gather(1, i[:, :k])
        ok = torch.isfinite(sd)
        sk = torch.where(ok, self.key[sp], _BIG)
        o = torch.argsort(sk, dim=1, stable=True)
        o = o.gather(1, torch.argsort(sd.gather(1, o), dim=1, stable=True))
        return sd.gather(1, o), torch.where(ok.gather(1, o), sp.gather(1, o), -1), tie

    def _finish(self, d2: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sorted positions -> row indices of ``x`` (``-1`` padding)."""
        return d2, torch.where(pos >= 0, self.order[pos.clamp_min(0)], -1)

    # ------------------------------------------------------------------ queries
    def knn(self, y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(d2, idx)`` of shape (m, k): squared float64 distances ascending, rows of ``x``
        (ties by ``key``), padded with ``inf`` / ``-1`` when ``x`` has fewer than ``k`` rows."""
        yd = y.detach().double().to(self.device)
        m = yd.shape[0]
        if m == 0 or self.n == 0:
            return (torch.full((m, k), float("inf"), dtype=torch.float64, device=self.device),
                    torch.full((m, k), -1, dtype=torch.int64, device=self.device))
        kk = min(k, self.n)
        c = self._cells(yd)
        # pass 1: a box around the ball that should hold ``_AHEAD * kk`` points at the density
        # of the 3^d cells around the query; where that box holds fewer than kk points, the
        # smallest box of 2^j cells around the query's cell that holds kk
        one = torch.ones(m, dtype=torch.int64, device=self.device)
        clo, chi = self._around(c, one)
        live = [i for i in range(self.d) if self.G[i] > 1]
        vol = torch.ones(m, dtype=torch.float64, device=self.device)
        for i in live:
            vol = vol * ((chi[:, i] - clo[:, i] + 1) * self.h)
        dd = max(len(live), 1)
        ball = math.pi ** (dd / 2) / math.gamma(dd / 2 + 1)
        dens = self._box_count(clo, chi).double() / vol
        reach = (_AHEAD * kk / (ball * dens)) ** (1 / dd)
        clo, chi = self._range(yd, torch.where(torch.isfinite(reach), reach, 0.0))
        enough = self._box_count(clo, chi) >= kk
        levels = max(1, math.ceil(math.log2(max(self.G)))) + 1
        best = torch.full((m,), 1 << (levels - 1), dtype=torch.int64, device=self.device)
        for lv in reversed(range(levels)):
            s = 1 << lv
            blo, bhi = self._around(c, one * s)
            best = torch.where(self._box_count(blo, bhi) >= kk, s, best)
        blo, bhi = self._around(c, best)
        clo = torch.where(enough[:, None], clo, blo)
        chi = torch.where(enough[:, None], chi, bhi)
        d2, pos, tied = self._pass(yd, clo, chi, None, kk, None, exact=False)
        # pass 2: queries whose k-th distance reaches past their box search all cells within
        # it; those with a tie across the k-th place are redone with keys
        reach = d2[:, kk - 1].sqrt() * (1 + _SLACK) + 1e-300
        redo = (reach >= self._margin(yd, clo, chi) * (1 - _SLACK)) | tied
        clo2, chi2 = self._range(yd, torch.where(redo, reach, 0.0))
        d2b, posb, _ = self._pass(yd, clo2, chi2, redo, kk, None)
        d2 = torch.where(redo[:, None], d2b, d2)
        pos = torch.where(redo[:, None], posb, pos)
        d2, idx = self._finish(d2, pos)
        if kk < k:
            d2 = torch.cat([d2, d2.new_full((m, k - kk), float("inf"))], 1)
            idx = torch.cat([idx, idx.new_full((m, k - kk), -1)], 1)
        return d2, idx

    def knn_within(self, y: torch.Tensor, k: int, reach: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` nearest points no farther than ``reach`` (m,) from each query, as
        :meth:`knn` returns them (``inf`` / ``-1`` where fewer lie within reach). One pass,
        one host sync: a query that brings its bound (a forwarded kNN query) needs no box
        search first."""
        yd = y.detach().double().to(self.device)
        m = yd.shape[0]
        if m == 0 or self.n == 0:
            return (torch.full((m, k), float("inf"), dtype=torch.float64, device=self.device),
                    torch.full((m, k), -1, dtype=torch.int64, device=self.device))
        big = max(self.h * max(self.G), 1.0) * 4  # past the grid: the whole grid
        reach = torch.nan_to_num(reach.double().to(self.device), posinf=big).clamp(0, big)
        clo, chi = self._range(yd, reach * (1 + _SLACK))
        d2, pos, _ = self._pass(yd, clo, chi, None, k, None)
        d2, idx = self._finish(d2, pos)
        ok = d2 <= reach[:, None].pow(2) * (1 + 4 * _SLACK)
        return torch.where(ok, d2, float("inf")), torch.where(ok, idx, -1)

    def radius_padded(self, y: torch.Tensor, r: float, width: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The closest ``width`` points within ``r`` (``<= r``) of each query, by (distance,
        key): ``(d2, idx)`` of shape (m, width) padded with ``inf`` / ``-1``. Static shape:
        one host sync (the candidate chunks' widths)."""
        yd = y.detach().double().to(self.device)
        m = yd.shape[0]
        if m == 0 or self.n == 0:
            return (torch.full((m, width), float("inf"), dtype=torch.float64, device=self.device),
                    torch.full((m, width), -1, dtype=torch.int64, device=self.device))
        reach = torch.full((m,), float(r) * (1 + _SLACK), dtype=torch.float64, device=self.device)
        clo, chi = self._range(yd, reach)
        d2, pos, _ = self._pass(yd, clo, chi, None, width, float(r))
        return self._finish(d2, pos)

    def radius(self, y: torch.Tensor, r: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All points within ``r`` (``<= r``): ``(ptr, idx, d2)`` in CSR, each query's list
        sorted by (distance, key). Host syncs: the chunk widths, and one per chunk of queries
        for the compaction."""
        yd = y.detach().double().to(self.device)
        m = yd.shape[0]
        dev = self.device
        ptr = torch.zeros(m + 1, dtype=torch.int64, device=dev)
        if m == 0 or self.n == 0:
            return ptr, torch.empty(0, dtype=torch.int64, device=dev), \
                torch.empty(0, dtype=torch.float64, device=dev)
        reach = torch.full((m,), float(r) * (1 + _SLACK), dtype=torch.float64, device=dev)
        clo, chi = self._range(yd, reach)
        count, nrows = self._sizes(clo, chi)
        idx_parts, d2_parts = [], []
        got = torch.zeros(m, dtype=torch.int64, device=dev)
        for a, b, C, R in self._chunks(count, nrows):
            p, valid = self._candidates(clo[a:b], chi[a:b], count[a:b], nrows[a:b], C, R)
            cd2 = self._dist(yd[a:b], p)
            valid &= cd2.sqrt() <= r
            cd2 = torch.where(valid, cd2, float("inf"))
            ck = torch.where(valid, self.key[p], _BIG)
            o = torch.argsort(ck, dim=1, stable=True)
            o = o.gather(1, torch.argsort(cd2.gather(1, o), dim=1, stable=True))
            sd, sp, sv = cd2.gather(1, o), p.gather(1, o), valid.gather(1, o)
            got[a:b] = sv.sum(1)
            keep = torch.nonzero(sv.reshape(-1)).flatten()  # host sync: the compaction
            idx_parts.append(self.order[sp.reshape(-1)[keep]])
            d2_parts.append(sd.reshape(-1)[keep])
        ptr[1:] = torch.cumsum(got, 0)
        if not idx_parts:
            return ptr, torch.empty(0, dtype=torch.int64, device=dev), \
                torch.empty(0, dtype=torch.float64, device=dev)
        return ptr, torch.cat(idx_parts), torch.cat(d2_parts)


def _select(d2: torch.Tensor, key: torch.Tensor, pos: torch.Tensor, k: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the ``k`` entries smallest by (d2, key), sorted; ``(d2, pos)`` with
    ``inf`` / ``-1`` where a row has fewer valid entries (``key == _BIG`` marks invalid)."""
    kth = torch.topk(d2, k, dim=1, largest=False).values[:, -1:]
    less = d2 < kth
    tie = (d2 == kth) & (key != _BIG)
    # all entries below the k-th distance, then the lowest keys among those equal to it
    rank = torch.where(less, -1, torch.where(tie, key, _BIG))
    take = torch.topk(rank, k, dim=1, largest=False).indices
    sd, sk, sp = d2.gather(1, take), key.gather(1, take), pos.gather(1, take)
    ok = rank.gather(1, take) != _BIG
    sd = torch.where(ok, sd, float("inf"))
    sk = torch.where(ok, sk, _BIG)
    o = torch.argsort(sk, dim=1, stable=True)
    o = o.gather(1, torch.argsort(sd.gather(1, o), dim=1, stable=True))
    sd, sp, ok = sd.gather(1, o), sp.gather(1, o), ok.gather(1, o)
    return sd, torch.where(ok, sp, -1)
