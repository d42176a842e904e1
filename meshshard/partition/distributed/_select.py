"""Distributed selection on the key ``(coord, global row)`` without moving the points.

Used by the parallel RCB: for every tree node of one level at once, find the key of the k-th
smallest point of the node (count mode), or how many points lie before the weighted cut
(weight mode: the number of points whose weight-interval midpoint ``S(<e) + w_e / 2`` is below
the bound ``B``, the rule of the single-process RCB). Each round every rank sends a few regular
samples of its candidates (one all_gather), the ranks agree on up to 63 pivots, count and weigh
their candidates between pivots (one all_reduce), and keep only the pivot interval holding the
answer; a node whose candidates number at most ``gather_max`` in all is finished exactly on the
gathered candidates. Keys are unique (the global row breaks coordinate ties), so every pivot
interval drops at least one sample and the loop ends.
"""

from __future__ import annotations

import numpy as np

from meshshard.comm.host import Comm

__all__ = ["select"]

GATHER_MAX = 8192
SAMPLES = 128
PIVOTS = 63


def _lex_order(c: np.ndarray, g: np.ndarray) -> np.ndarray:
    return np.lexsort((g, c))


def _buckets(c: np.ndarray, g: np.ndarray, pc: np.ndarray, pg: np.ndarray) -> np.ndarray:
    """Number of pivots ``(pc, pg)`` (sorted by key) strictly below each ``(c, g)``."""
    b = np.searchsorted(pc, c, side="left")
    q = pc.size
    tie = np.flatnonzero(pc[np.minimum(b, q - 1)] == c)  # coordinate equals a pivot's
    if tie.size:
        hi = np.searchsorted(pc, c[tie], side="right")
        starts = b[tie]
        for s in np.unique(starts).tolist():
            at = starts == s
            sel = tie[at]
            e = int(hi[at][0])
            b[sel] += np.searchsorted(pg[s:e], g[sel], side="left")
    return b


def select(
    comm: Comm,
    cands: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]],
    requests: list[tuple[str, float] | None],
    *,
    gather_max: int | None = None,
) -> list[object]:
    """Batched distributed selection (collective: every rank of ``comm`` must call it with
    the same number of nodes and the same requests).

    Parameters
    ----------
    cands : list of (coord float64, row int32/int64, weight float64 or None)
        This rank's points of each node.
    requests : list of ("count", k) | ("weight", B) | None
        Per node: the k-th smallest key (1-based), or the number of points before the weighted
        bound ``B``; None skips the node.

    Returns
    -------
    list
        Per node: ``(coord, row)`` of the k-th key (count mode), ``int`` count (weight mode),
        or None.
    """
    gather_max = GATHER_MAX if gather_max is None else gather_max
    J = len(cands)
    c = [np.asarray(x[0], dtype=np.float64) for x in cands]
    g = [np.asarray(x[1]) for x in cands]  # int32 or int64 global rows (no copy)
    w = [None if x[2] is None else np.asarray(x[2], dtype=np.float64) for x in cands]
    below_n = [0] * J
    below_w = [0.0] * J
    out: list[object] = [None] * J
    todo = [j for j in range(J) if requests[j] is not None]
    while todo:
        comm.phase = "rcb select"
        tot = comm.allreduce(np.array([c[j].size for j in todo], dtype=np.int64))
        small = [j for j, t in zip(todo, tot.tolist()) if t <= gather_max]
        big = [j for j, t in zip(todo, tot.tolist()) if t > gather_max]
        if small:
            _finish(comm, small, c, g, w, requests, below_n, below_w, out)
        if big:
            _narrow(comm, big, c, g, w, requests, below_n, below_w, out)
        todo = [j for j in big if out[j] is None]
    return out


def _finish(comm, nodes, c, g, w, requests, below_n, below_w, out) -> None:
    """Gather the (few) remaining candidates of ``nodes`` to every rank and solve exactly."""
    fl = np.concatenate(
        [np.stack([c[j], w[j] if w[j] is not None else np.zeros_like(c[j])], axis=1)
         for j in nodes]
    )  # fmt: skip
    it = np.concatenate(
        [np.stack([np.full(c[j].size, i, dtype=np.int64), g[j]], axis=1)
         for i, j in enumerate(nodes)]
    )  # fmt: skip
    allf = np.concatenate(comm.allgatherv(fl))
    alli = np.concatenate(comm.allgatherv(it))
    for i, j in enumerate(nodes):
        sel = alli[:, 0] == i
        cc, gg, ww = allf[sel, 0], alli[sel, 1], allf[sel, 1]
        o = _lex_order(cc, gg)
        mode, val = requests[j]
        if mode == "count":
            pos = int(val) - below_n[j] - 1
            out[j] = (float(cc[o][pos]), int(gg[o][pos]))
        else:
            ws = ww[o]
            mid = below_w[j] + np.cumsum(ws) - 0.5 * ws
            out[j] = below_n[j] + int(np.searchsorted(mid, float(val), side="left"))


def _narrow(comm, nodes, c, g, w, requests, below_n, below_w, out) -> None:
    """One sampling round: agree on pivots, count between them, keep the interval holding
    the answer."""
    nb = len(nodes)
    sf = np.full((nb, SAMPLES, 2), np.nan)
    si = np.zeros((nb, SAMPLES), dtype=np.int64)
    sn = np.zeros(nb, dtype=np.int64)
    for i, j in enumerate(nodes):
        m = c[j].size
        s = min(m, SAMPLES)
        if s:
            pick = (np.arange(s, dtype=np.int64) * m) // s
            sf[i, :s, 0] = c[j][pick]
            sf[i, :s, 1] = w[j][pick] if w[j] is not None else 0.0
            si[i, :s] = g[j][pick]
        sn[i] = s
    allf, alli, alln = comm.allgather(sf), comm.allgather(si), comm.allgather(sn)
    pivots = []
    hist_n = np.zeros((nb, PIVOTS + 1), dtype=np.int64)
    hist_w = np.zeros((nb, PIVOTS + 1), dtype=np.float64)
    buckets = []
    for i, j in enumerate(nodes):
        pcs = np.concatenate([allf[r, i, : alln[r, i], 0] for r in range(comm.world)])
        pws = np.concatenate([allf[r, i, : alln[r, i], 1] for r in range(comm.world)])
        pgs = np.concatenate([alli[r, i, : alln[r, i]] for r in range(comm.world)])
        o = _lex_order(pcs, pgs)
        S = o.size
        q = min(PIVOTS, S - 1)
        at = o[(np.arange(1, q + 1) * S) // (q + 1)]
        pc, pg, pw = pcs[at], pgs[at], pws[at]
        pivots.append((pc, pg, pw))
        b = _buckets(c[j], g[j], pc, pg)
        buckets.append(b)
        hist_n[i, : q + 1] = np.bincount(b, minlength=q + 1)
        if w[j] is not None:
            hist_w[i, : q + 1] = np.bincount(b, weights=w[j], minlength=q + 1)
    hist_n = comm.allreduce(hist_n)
    hist_w = comm.allreduce(hist_w)
    for i, j in enumerate(nodes):
        pc, pg, pw = pivots[i]
        q = pc.size
        n_le = below_n[j] + np.cumsum(hist_n[i, :q])
        w_le = below_w[j] + np.cumsum(hist_w[i, :q])
        mode, val = requests[j]
        if mode == "count":
            hit = np.flatnonzero(n_le == int(val))
            if hit.size:
                out[j] = (float(pc[hit[0]]), int(pg[hit[0]]))
                continue
            true = n_le < int(val)
        else:
            true = (w_le - 0.5 * pw) < float(val)
        lo = int(np.count_nonzero(true)) - 1  # last pivot on the "before" side (monotone)
        hi = lo + 1
        if lo >= 0:
            below_n[j] = int(n_le[lo])
            below_w[j] = float(w_le[lo])
        b = buckets[i]
        keep = (b > lo) & (b <= hi)
        c[j], g[j] = c[j][keep], g[j][keep]
        if w[j] is not None:
            w[j] = w[j][keep]
