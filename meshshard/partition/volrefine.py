"""k-way Fiduccia–Mattheyses refinement of the communication volume of a graph partition.

Why: a one-ring halo refresh (a GNN layer on a sharded mesh) moves exactly the communication
volume of the partition: the number of (vertex, other part) pairs with the vertex adjacent to
that part (METIS ``-objtype=vol``). METIS' own volume refinement is greedy (positive-gain moves
only) and stops in local minima. This pass climbs out of them: it moves boundary vertices in
order of gain, accepting zero- and negative-gain moves for a window of moves, and then rolls
back to the best prefix of the sequence. So the volume never increases, and a partition that
FM cannot improve is returned unchanged. On a 1M-tet mesh at P=4 it removes ~2 % of METIS'
volume on its own, more when combined with several METIS seeds
(:func:`meshshard.partition.graphpart.metis`'s ``tries``).

What it does, per pass: every boundary vertex gets a heap entry (gain, tie key, vertex, target
part) for each part among its neighbours; the best entry is re-checked (exact gain from the
current neighbour counts), moved if the target stays within its weight cap, and locked for the
rest of the pass; the gains of its two-ring are pushed again. A pass ends when the heap is
empty or ``window`` moves have not improved the best volume seen; passes stop when one gains
nothing. Ties break by a random order of the vertices drawn from ``seed`` (deterministic).

Balance: part ``p`` may hold at most ``(1 + ufactor/1000) * targets[p] * total weight`` (the
bound METIS uses). A move never makes a part exceed its cap, and parts with a zero target
never receive a vertex; a part that was already over its cap (given input) only shrinks.

The per-move work is pure Python over dicts of the touched vertices only (neighbour lists and
neighbour-part counts are built lazily), so its cost scales with the boundary, not the mesh.

Where it still pays (measured 2026-12-02, 200k uniform points, kNN-8, one thread): after METIS
``objective="vol"`` it removes 1.0-1.2 % of the ghost rows (P=4: 9,826 -> 9,709; P=16: 23,988 ->
23,751) for 3-5 s; after :func:`meshshard.partition.hypergraph.hypergraph`, which minimises the
same quantity exactly, it finds almost nothing (9,415 -> 9,409; 22,380 -> 22,378) for +20 %
CPU; on a 196k-tet gmsh volume 0.25-0.5 % (P=4: 6,482 -> 6,466; P=16: 16,368 -> 16,289).
So it is kept for installs without the optional ``mtkahypar`` (METIS and KaMinPar), and is not
worth running on a hypergraph partition. Its vectorised, greedy counterpart
(:mod:`meshshard.partition.fastrefine`, ``refine="fast"``) ends within 0.0-1.1 % of its ghost
rows after METIS vol for 1/6-1/11 of its CPU (measured 2026-12-02, 200k and 1M, kNN and tets);
this FM stays as the slower option that climbs out of the local minima the fast pass stops in.
"""

from __future__ import annotations

import heapq
import logging
from typing import Any

import numpy as np

from meshshard.partition._validation import (
    _to_numpy,
    check_graph,
    check_int,
    check_targets,
    check_weights,
    unique_int,
)

__all__ = ["communication_volume", "refine_volume"]

log = logging.getLogger(__name__)

PASSES = 20
"""Most FM passes by default. Passes stop when one gains nothing: 7 on the 1M-tet gmsh mesh at
P=4; the graded 1M-cell generated volume, whose cut drifts a shell layer per pass, needed 15
(36,402 -> 34,122 rows after 8 passes, 33,227 after 15)."""
WINDOW = 2000
"""Moves without a new best volume after which a pass stops (8,000 gained < 0.2 % more on the
1M-tet mesh)."""


def communication_volume(graph: Any, assignment: np.ndarray, parts: int) -> int:
    """Distinct (vertex, other part) pairs over the edges of a CSR ``graph`` (vectorised):
    the ghost rows one halo refresh moves, METIS' ``-objtype=vol`` with unit sizes."""
    a = np.asarray(assignment, dtype=np.int64)
    rows = np.repeat(np.arange(a.size, dtype=np.int64), np.diff(graph.indptr))
    pc = a[graph.indices]
    cut = a[rows] != pc
    return int(unique_int(rows[cut] * int(parts) + pc[cut]).size)


def _check_ufactor(ufactor: Any) -> float:
    if isinstance(ufactor, bool) or not isinstance(ufactor, (int, float, np.integer,
                                                            np.floating)) or not (
        np.isfinite(ufactor) and ufactor >= 0
    ):  # fmt: skip
        msg = f"ufactor={ufactor!r} must be a number >= 0 (allowed imbalance in thousandths)"
        raise ValueError(msg)
    return float(ufactor)


def _check_assignment(assignment: Any, n: int, parts: int) -> np.ndarray:
    a = _to_numpy(assignment)
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        msg = f"assignment must hold integer part labels, got dtype {a.dtype}"
        raise ValueError(msg)
    if a.shape != (n,):
        msg = f"assignment must have shape ({n},) (one label per graph vertex), got {a.shape}"
        raise ValueError(msg)
    if n and (a.min() < 0 or a.max() >= parts):
        bad = np.flatnonzero((a < 0) | (a >= parts))
        msg = (
            f"assignment has {bad.size} label(s) outside [0, {parts}) (first at vertex "
            f"{bad[0]}: {a[bad[0]]}); labels must be part numbers 0..parts-1"
        )
        raise ValueError(msg)
    return a.astype(np.int64)


def refine_volume(graph_csr: Any, assignment: Any, parts: int, *, weights: Any = None,
                  targets: Any = None, ufactor: float = 30, passes: int = PASSES,
                  window: int = WINDOW, seed: int = 0) -> np.ndarray:  # fmt: skip
    """Lower the communication volume of ``assignment`` on ``graph_csr`` by k-way FM.

    Parameters
    ----------
    graph_csr : scipy.sparse matrix of shape (N, N)
        Symmetric adjacency without self loops (edge weights are ignored: the volume counts
        vertices), e.g. :func:`meshshard.partition.dual_graph` of a mesh.
    assignment : int array of shape (N,)
        Part of every vertex, in ``[0, parts)``.
    parts : int
        Number of parts P >= 1.
    weights : array of shape (N,), optional
        Non-negative vertex weights to balance (default: 1 each).
    targets : array of shape (P,), optional
        Target fraction of the total weight per part (sums to 1; zeros stay empty).
    ufactor : float
        Allowed imbalance in thousandths, as METIS' ``-ufactor`` (30 = 3 %).
    passes : int
        Most FM passes (each stops early; the passes stop when one gains nothing).
    window : int
        Moves without a new best volume after which a pass stops (the hill-climbing depth).
    seed : int
        Seed of the tie-breaking order (the result is deterministic for a fixed seed).

    Returns
    -------
    numpy.ndarray of shape (N,), int64
        The refined assignment; its volume is at most the input's.

    Raises
    ------
    ValueError, TypeError
        Malformed graph, assignment of the wrong length or dtype, labels outside
        ``[0, parts)``, bad weights/targets, negative ``ufactor``, ``passes``/``window`` < 1,
        ``seed`` < 0.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> path = sp.diags([1, 1], [-1, 1], shape=(6, 6), format="csr", dtype=int)  # 0-1-..-5
    >>> a = np.array([0, 1, 0, 1, 1, 1])
    >>> communication_volume(path, a, 2), communication_volume(
    ...     path, refine_volume(path, a, 2, ufactor=400), 2)
    (4, 2)
    """
    passes = check_int("passes", passes, 1)
    window = check_int("window", window, 1)
    g, a, parts, w, t, ufactor, seed = check_refine_args(graph_csr, assignment, parts, weights,
                                                         targets, ufactor, seed)
    return _refine(g, a, parts, w, t, float(ufactor), passes, window, seed)


def check_refine_args(graph_csr: Any, assignment: Any, parts: Any, weights: Any, targets: Any,
                      ufactor: Any, seed: Any) -> tuple:
    """The validated ``(graph, assignment, parts, weights, targets, ufactor, seed)`` of a
    ghost-row refinement (shared by the FM here and :mod:`.fastrefine`)."""
    parts = check_int("parts", parts, 1)
    seed = check_int("seed", seed, 0)
    ufactor = _check_ufactor(ufactor)
    g = check_graph(graph_csr)
    n = g.shape[0]
    a = _check_assignment(assignment, n, parts)
    w = check_weights(None if weights is None else _to_numpy(weights), n)
    return g, a, parts, w, check_targets(targets, parts), ufactor, seed


def _refine(
    g: Any,
    a0: np.ndarray,
    parts: int,
    w: np.ndarray | None,
    t: np.ndarray,
    ufactor: float,
    passes: int,
    window: int,
    seed: int,
) -> np.ndarray:
    """:func:`refine_volume` on inputs already checked (a canonical CSR graph): the FM passes,
    never returning a worse volume than ``a0``'s."""
    n = a0.size
    if parts == 1 or n == 0:
        return a0.copy()
    start = communication_volume(g, a0, parts)
    indptr, indices = g.indptr, g.indices
    lab: list[int] = a0.tolist()
    wt = [] if w is None else w.tolist()
    load = (np.bincount(a0, minlength=parts) if w is None
            else np.bincount(a0, weights=w, minlength=parts)).astype(float).tolist()  # fmt: skip
    total = float(n if w is None else w.sum())
    cap = ((1.0 + ufactor / 1000.0) * t * total).tolist()
    live = (t > 0).tolist()
    key = np.random.default_rng(seed).permutation(n).tolist()  # tie-breaking order
    nb_cache: dict[int, list[int]] = {}
    cnt: dict[int, dict[int, int]] = {}  # vertex -> {part: neighbours in part}

    def nbrs(v: int) -> list[int]:
        r = nb_cache.get(v)
        if r is None:
            r = nb_cache[v] = indices[indptr[v] : indptr[v + 1]].tolist()
        return r

    def counts(v: int) -> dict[int, int]:
        c = cnt.get(v)
        if c is None:
            c = cnt[v] = {}
            for u in nbrs(v):
                p = lab[u]
                c[p] = c.get(p, 0) + 1
        return c

    def gains(v: int) -> dict[int, int]:
        """Volume decrease for moving v to each live neighbouring part (exact, current)."""
        src = lab[v]
        cv = cnt.get(v) or counts(v)
        cand = [b for b in cv if b != src and live[b]]
        if not cand:
            return {}
        # v's own term: + [v sees b] (always, b is a neighbour part) - [v sees its own part]
        base = 1 - (1 if src in cv else 0)
        gb = dict.fromkeys(cand, 0)
        for u in nbrs(v):
            pu = lab[u]
            cu = cnt.get(u) or counts(u)  # (inlined lookup: the hot loop)
            if pu != src and cu[src] == 1:  # u no longer sees src
                base += 1
            for b in cand:
                if pu != b and b not in cu:  # u starts to see b
                    gb[b] -= 1
        for b in cand:
            gb[b] += base
        return gb

    def move(v: int, dst: int) -> None:
        src = lab[v]
        lab[v] = dst
        wv = 1.0 if w is None else wt[v]
        load[src] -= wv
        load[dst] += wv
        for u in nbrs(v):
            c = cnt.get(u)
            if c is not None:
                k = c[src] - 1
                if k:
                    c[src] = k
                else:
                    del c[src]
                c[dst] = c.get(dst, 0) + 1

    heap: list[tuple[int, int, int, int]] = []

    def push(v: int) -> None:
        kv = key[v]
        for b, gv in gains(v).items():
            heapq.heappush(heap, (-gv, kv, v, b))

    for it in range(passes):
        a_now = np.asarray(lab, dtype=np.int64)
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        boundary = unique_int(rows[a_now[rows] != a_now[indices]]).tolist()
        heap = [(-gv, key[v], v, b) for v in boundary for b, gv in gains(v).items()]
        heapq.heapify(heap)
        locked: set[int] = set()
        moves: list[tuple[int, int]] = []  # (vertex, part it left), in order
        cur = best = best_len = since = 0
        while heap and since < window:
            ng, _, v, b = heapq.heappop(heap)
            if v in locked or lab[v] == b:
                continue
            gv = gains(v).get(b)
            if gv is None:  # b is no longer a live neighbouring part
                continue
            if gv != -ng:  # stale entry: put it back with its current gain
                heapq.heappush(heap, (-gv, key[v], v, b))
                continue
            wv = 1.0 if w is None else wt[v]
            if load[b] + wv > cap[b]:
                continue
            moves.append((v, lab[v]))
            move(v, b)
            locked.add(v)
            cur += gv
            if cur > best:
                best, best_len, since = cur, len(moves), 0
            else:
                since += 1
            ring = set(nbrs(v))
            for u in list(ring):
                ring.update(nbrs(u))
            ring -= locked
            for u in ring:
                push(u)
        for v, src in reversed(moves[best_len:]):  # roll back to the best prefix
            move(v, src)
        log.debug("FM pass %d: %d boundary vertices, %d moves, %d kept, volume -%d", it,
                  len(boundary), len(moves), best_len, best)  # fmt: skip
        if best <= 0:
            break
    out = np.asarray(lab, dtype=np.int64)
    if communication_volume(g, out, parts) > start:  # cannot happen; never return worse
        return a0.copy()
    return out
