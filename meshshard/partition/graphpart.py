"""METIS graph partitioning through pymetis (k-way by default).

The graph is validated before pymetis sees it (a malformed graph can crash the process).
Without a graph, a symmetric kNN graph of the points is built (:func:`knn_graph`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshshard.partition._validation import (
    _to_numpy,
    as_points,
    check_graph,
    check_parts,
    check_targets,
    check_weights,
)
from meshshard.partition.fastrefine import ROUNDS, _refine_fast
from meshshard.partition.graph import knn_graph_sorted
from meshshard.partition.record import Partition
from meshshard.partition.sfc import curve_order, group_by_shard, hilbert_codes
from meshshard.partition.volrefine import PASSES, WINDOW, _refine, communication_volume

__all__ = ["OBJECTIVES", "REFINEMENTS", "metis", "metis_assignment"]

log = logging.getLogger(__name__)

_WEIGHT_SCALE = 1000  # float weights -> METIS integer vertex weights (relative precision 1e-3)


OBJECTIVES = ("cut", "vol")
"""METIS objectives: ``"cut"`` minimises the edges between shards (METIS' default), ``"vol"``
the communication volume, i.e. the ghost rows a halo refresh moves (``-objtype=vol``)."""


REFINEMENTS = ("volume", "fast")
"""Refinements after the partitioner: ``"volume"``, k-way FM on the communication volume
(:func:`meshshard.partition.volrefine.refine_volume`); ``"fast"``, vectorised batched
exact-gain moves (:func:`meshshard.partition.fastrefine.refine_volume_fast`)."""


def check_refine(refine: Any, tries: Any) -> str | None:
    """Validate ``refine`` (None/False, True or ``"volume"``) and ``tries`` (int >= 1);
    return the refinement's name or None."""
    if isinstance(tries, bool) or not isinstance(tries, (int, np.integer)) or tries < 1:
        msg = f"tries={tries!r} must be an integer >= 1 (independent runs, one seed each)"
        raise ValueError(msg)
    if refine is None or refine is False:
        return None
    if refine is True:
        return "volume"
    if isinstance(refine, str) and refine in REFINEMENTS:
        return refine
    msg = (f"refine={refine!r} is not one of None, False, True or {REFINEMENTS}: use 'volume' "
           "or 'fast'")
    raise ValueError(msg)


def metis_seeds(seed: int, tries: int) -> list[int]:
    """``tries`` METIS seeds from ``seed`` up, skipping 1 after 0: METIS (GKlib's generator)
    gives seeds 0 and 1 the same partition."""
    out: list[int] = []
    s = int(seed)
    while len(out) < tries:
        if not (s == 1 and 0 in out):
            out.append(s)
        s += 1
    return out


def _check_objective(objective: Any, recursive: bool, niter: Any, ncuts: Any) -> None:
    """One place for the option checks, before pymetis sees them (it aborts on bad ones)."""
    if objective not in OBJECTIVES:
        msg = f"objective={objective!r} is not one of {OBJECTIVES}: use 'cut' or 'vol'"
        raise ValueError(msg)
    if objective == "vol" and recursive:
        msg = (
            "objective='vol' needs k-way METIS, but recursive=True was given: set "
            "recursive=False (METIS' recursive bisection only minimises the edge cut)"
        )
        raise ValueError(msg)
    for name, val in (("niter", niter), ("ncuts", ncuts)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, (int, np.integer))
                                or val < 1):  # fmt: skip
            msg = f"{name}={val!r} must be an integer >= 1 (or None for METIS' default)"
            raise ValueError(msg)


def _int_weights(w: np.ndarray) -> np.ndarray:
    """Positive float weights -> int32 METIS vertex weights, proportional, zeros kept."""
    scaled = np.rint(w / w.max() * _WEIGHT_SCALE)
    scaled[(w > 0) & (scaled < 1)] = 1
    return scaled.astype(np.int32)


def metis_assignment(
    graph: Any,
    parts: int,
    *,
    weights: np.ndarray | None = None,
    targets: np.ndarray | None = None,
    recursive: bool = False,
    ufactor: int = 30,
    contig: bool = False,
    seed: int = 0,
    objective: str = "cut",
    niter: int | None = None,
    ncuts: int | None = None,
) -> np.ndarray:
    """Shard label per vertex from pymetis on a validated CSR graph.

    Parts with a zero target are left out of the METIS call (they stay empty). METIS bounds
    only how far a part may exceed its target, so with small targets it may starve a part
    (k-way has left a 1.5 % target empty): when a part with a positive target holds less than
    its target by more than the balance bound (``ufactor`` thousandths of it, plus one vertex),
    METIS is asked again with recursive bisection and tighter ``ufactor`` (a warning says so);
    if no call meets the targets, a ``ValueError`` names the part and its achieved size.
    """
    first = _metis_call(graph, parts, weights, targets, recursive, ufactor, contig, seed,
                        objective, niter, ncuts)  # fmt: skip
    short = _starved(first, parts, weights, targets, ufactor)
    if short is None:
        return first
    rec = objective != "vol"  # the volume objective is k-way only
    tighter = sorted({int(ufactor), *(int(ufactor) >> k for k in (1, 2, 3))}, reverse=True)
    for u in tighter:
        if (rec, u) == (bool(recursive), int(ufactor)) or u < 1:
            continue
        got = _metis_call(graph, parts, weights, targets, rec, u, contig, seed, objective,
                          niter, ncuts)  # fmt: skip
        if _starved(got, parts, weights, targets, ufactor) is None:
            log.warning(
                "metis: %s left part %d with %d (target %.0f); recursive bisection (k-way for "
                "objective='vol') with ufactor=%d meets the targets",
                "recursive bisection" if recursive else "k-way", *short[:3], u,
            )  # fmt: skip
            return got
    p, got_size, want, low = short
    msg = (
        f"metis cannot meet targets={np.round(np.asarray(_targets(parts, targets)), 6).tolist()} "
        f"on this graph: part {p} got {got_size} (target {want:.0f}, at least {low:.0f} within "
        f"ufactor={int(ufactor)}), also with tighter balance; use method='rcb' (meets "
        "targets by construction) or a larger target for that part"
    )
    raise ValueError(msg)


def _targets(parts: int, targets: np.ndarray | None) -> np.ndarray:
    return np.full(parts, 1.0 / parts) if targets is None else np.asarray(targets, float)


def _starved(
    labels: np.ndarray, parts: int, weights: np.ndarray | None, targets: np.ndarray | None,
    ufactor: float,
) -> tuple[int, int, float, float] | None:  # fmt: skip
    """The first part with a positive target whose size (weight) falls short of it by more
    than the balance bound, as ``(part, size, target size, least size allowed)``, or None."""
    t = _targets(parts, targets)
    w = np.ones(labels.size) if weights is None else np.asarray(weights, dtype=np.float64)
    if labels.size == 0:
        return None
    total, heaviest = float(w.sum()), float(w.max())
    sizes = np.bincount(labels, weights=w, minlength=parts)
    want = t / t.sum() * total
    low = want * (1.0 - float(ufactor) / 1000.0) - heaviest
    bad = np.flatnonzero((t > 0) & (sizes < low))
    if bad.size == 0:
        return None
    p = int(bad[0])
    return p, int(round(sizes[p])), float(want[p]), float(max(low[p], 0.0))


def _metis_call(
    graph: Any, parts: int, weights: np.ndarray | None, targets: np.ndarray | None,
    recursive: bool, ufactor: int, contig: bool, seed: int, objective: str,
    niter: int | None, ncuts: int | None,
) -> np.ndarray:  # fmt: skip
    import pymetis

    _check_objective(objective, recursive, niter, ncuts)
    n = graph.shape[0]
    t = np.full(parts, 1.0 / parts) if targets is None else targets
    live = np.flatnonzero(t > 0)
    if live.size == 1 or n == 0:
        return np.full(n, live[0], dtype=np.int64)
    if live.size >= n:  # one vertex per part (callers checked allow_empty)
        return live[np.arange(n)]
    adjacency = pymetis.CSRAdjacency(
        graph.indptr.astype(np.int32, copy=False), graph.indices.astype(np.int32, copy=False)
    )
    tp = (t[live] / t[live].sum()).tolist()
    equal = np.allclose(tp, 1.0 / live.size)
    extra = {} if niter is None else {"niter": int(niter)}
    if ncuts is not None:
        extra["ncuts"] = int(ncuts)
    if objective == "vol":
        extra["objtype"] = int(pymetis.ObjType.VOL)
    opts = pymetis.Options(ufactor=int(ufactor), contig=int(bool(contig)), seed=int(seed), **extra)
    result = pymetis.part_graph(
        int(live.size),
        adjacency=adjacency,
        vweights=None if weights is None else _int_weights(weights),
        tpwgts=None if equal else tp,
        recursive=bool(recursive),
        options=opts,
    )
    labels = np.asarray(result.vertex_part, dtype=np.int64)
    log.debug("pymetis: %d parts, METIS edge cut %d", live.size, result.edge_cuts)
    return live[labels]


def metis(points: Any, parts: int, *, weights: Any = None, targets: Any = None,
          allow_empty: bool = False, graph: Any = None, knn: int = 8, recursive: bool = False,
          ufactor: int = 30, contig: bool = False, seed: int = 0, objective: str = "cut",
          niter: int | None = None, ncuts: int | None = None, refine: bool | str | None = None,
          tries: int = 1) -> Partition:  # fmt: skip
    """Partition with METIS on a graph of the points (or cells).

    Parameters
    ----------
    points : array of shape (N, 3) or (N, 2), or None
        Coordinates; used to build the kNN graph when ``graph`` is None, and to order rows
        inside each shard along a Hilbert curve (locality). May be None when ``graph`` is given.
    parts : int
        Number of shards P >= 1 (P == 1 never calls METIS).
    weights : array of shape (N,), optional
        Non-negative vertex weights (scaled to integers, relative precision 1e-3).
    targets : array of shape (P,), optional
        Target fraction per shard (METIS ``tpwgts``); zeros give empty shards.
    allow_empty : bool
        Allow empty shards when N < P.
    graph : scipy.sparse matrix of shape (N, N), optional
        Symmetric adjacency without self loops, e.g. :func:`dual_graph` of a mesh.
    knn : int
        Neighbours per point of the kNN graph built when ``graph`` is None.
    recursive : bool
        Recursive bisection instead of k-way.
    ufactor : int
        Allowed imbalance in thousandths (METIS ``-ufactor``; 30 = 3 %).
    contig : bool
        Ask METIS for contiguous parts.
    seed : int
        METIS random seed (the result is deterministic for a fixed seed).
    objective : {"cut", "vol"}
        What METIS minimises: ``"cut"``, the edges between shards (METIS' default), or
        ``"vol"``, the communication volume: the number of (vertex, other shard) pairs, which is
        exactly the ghost rows a one-ring halo refresh moves per layer (a GNN's
        :func:`meshshard.graph.refresh_ghosts`). Use ``"vol"`` to minimise ghost traffic; it
        often cuts more edges. k-way only (``recursive=False``).
    niter : int, optional
        Refinement iterations per level (METIS ``-niter``; None: METIS' default, 10).
    ncuts : int, optional
        Number of partitionings METIS computes, keeping the best (``-ncuts``; None: 1).
    refine : {None, "volume", "fast"} or bool
        ``"fast"``: after METIS, lower the ghost rows with batched exact-gain moves
        (:func:`meshshard.partition.fastrefine.refine_volume_fast`, vectorised, a fraction of
        FM's time). ``"volume"`` (or True): lower the communication volume (ghost rows) with
        k-way FM (:func:`meshshard.partition.volrefine.refine_volume`) within the same
        balance (``ufactor``, weights, targets); never increases it. Pure Python: 5-40 s
        per try on a 1M-cell mesh at P=4 (longer where it keeps finding gains).
    tries : int
        Independent METIS runs with the seeds ``seed, seed + 1, ...`` (each refined when
        ``refine`` is set; METIS gives seeds 0 and 1 the same partition, so 1 is skipped
        after 0); the one with the fewest ghost rows is kept (with ``objective="cut"`` and no
        ``refine``: the smallest edge cut). ``params`` records ``try_seeds``, ``try_volumes``
        (and ``try_volumes_unrefined``, before refinement) and ``best_seed``.

    Returns
    -------
    Partition

    Raises
    ------
    ValueError
        Asymmetric or self-looped graph, mismatched sizes, bad weights/targets, an unknown
        ``objective``, ``objective="vol"`` with ``recursive=True``, ``niter``/``ncuts`` < 1,
        ``refine`` not None/bool/"volume"/"fast", ``tries`` < 1.

    Examples
    --------
    >>> import numpy as np
    >>> p = metis(np.random.default_rng(0).random((500, 3)), 4)
    >>> int(p.sizes.sum())
    500
    """
    _check_objective(objective, recursive, niter, ncuts)
    how = check_refine(refine, tries)
    params: dict[str, Any] = {
        "recursive": bool(recursive),
        "ufactor": int(ufactor),
        "contig": bool(contig),
        "seed": int(seed),
        "objective": objective,
    }
    if niter is not None:
        params["niter"] = int(niter)
    if ncuts is not None:
        params["ncuts"] = int(ncuts)

    def assign(g: Any, parts: int, w: np.ndarray | None, t: np.ndarray, s: int) -> np.ndarray:
        return metis_assignment(
            g, parts, weights=w,
            targets=t, recursive=recursive, ufactor=ufactor, contig=contig, seed=s,
            objective=objective, niter=niter, ncuts=ncuts,
        )  # fmt: skip

    return partition_on_graph(points, parts, assign, "metis", params, weights=weights,
                              targets=targets, allow_empty=allow_empty, graph=graph,
                              knn=knn, seeds=metis_seeds(seed, tries), refine=how,
                              ufactor=ufactor,
                              keep="volume" if objective == "vol" else "cut")  # fmt: skip


def partition_on_graph(points: Any, parts: int, assign: Any, method: str, params: dict, *,
                       weights: Any = None, targets: Any = None, allow_empty: bool = False,
                       graph: Any = None, knn: int = 8, seeds: Sequence[int] = (0,),
                       refine: str | None = None, ufactor: float = 30,
                       keep: str = "cut") -> Partition:  # fmt: skip
    """The part every graph partitioner shares (METIS, KaMinPar): check the inputs, build the
    kNN graph of ``points`` when no ``graph`` is given, call ``assign(graph, parts, weights,
    targets, seed)`` for each vertex's part (not for ``parts == 1``), and order each shard's
    rows along a Hilbert curve when there are coordinates. ``params`` (the partitioner's
    options) is recorded with the targets, weighting and graph kind.

    With several ``seeds``, ``assign`` runs once per seed and the result with the fewest
    ghost rows is kept (``keep="cut"`` without ``refine``: the fewest cut
    edges); ``refine="volume"`` refines each with :func:`refine_volume` within ``ufactor``
    (thousandths, as METIS) of the targets. Both are recorded in ``params``."""
    pts = None if points is None else as_points(points)
    order = None  # vertex a of the graph is point order[a] (None: identity)
    if graph is None:
        if pts is None:
            msg = f"{method} needs points or a graph; pass graph=dual_graph(mesh) or the points"
            raise ValueError(msg)
        parts = check_parts(parts, pts.shape[0], allow_empty=allow_empty)
        graph, order = knn_graph_sorted(pts, k=knn)
        graph_kind = f"knn{knn}"
    else:
        graph_kind = "given"
    n = graph.shape[0] if pts is None else pts.shape[0]
    parts = check_parts(parts, n, allow_empty=allow_empty)
    w = check_weights(None if weights is None else _to_numpy(weights), n)
    t = check_targets(targets, parts)
    # a graph we just built is valid by construction; a given one is checked before the library
    g = graph if order is not None else check_graph(graph, n)
    if parts == 1:
        assignment = np.zeros(n, dtype=np.int64)
    else:
        wg = w if (w is None or order is None) else w[order]  # weights in graph vertex order
        assignment, record = _best_of_tries(g, parts, assign, wg, t, seeds=list(seeds),
                                            refine=refine, ufactor=ufactor,
                                            keep=keep)  # fmt: skip
        params = {**params, **record}
        if order is not None:
            labels = assignment
            assignment = np.empty_like(labels)
            assignment[order] = labels
    if pts is not None and n and order is None:
        order = curve_order(hilbert_codes(pts))
    params = {"targets": t.tolist(), "weighted": w is not None, "graph": graph_kind, **params}
    if order is None:  # no coordinates: keep the original order inside each shard
        return Partition.from_assignment(assignment, parts, method=method, params=params)
    stored = group_by_shard(assignment, parts, order)  # rows of each shard in Hilbert order
    sizes = np.bincount(assignment, minlength=parts)
    return Partition(assignment, stored, sizes, method=method, params=params)


def _best_of_tries(
    g: Any,
    parts: int,
    assign: Any,
    w: np.ndarray | None,
    t: np.ndarray,
    *,
    seeds: list[int],
    refine: str | None,
    ufactor: float,
    keep: str,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Run ``assign`` once per seed, refine each when asked, keep the best
    (fewest ghost rows, or fewest cut edges when ``keep="cut"`` and no refinement; the first
    on ties). Returns the assignment and what to record in ``params`` (nothing by default)."""
    if refine is None and len(seeds) == 1:
        return assign(g, parts, w, t, seeds[0]), {}
    by_volume = refine is not None or keep == "volume"
    rows = None
    best, best_score, best_seed = None, None, seeds[0]
    before: list[int] = []
    after: list[int] = []
    cuts: list[int] = []
    for s in seeds:
        tic = time.perf_counter()
        a = np.asarray(assign(g, parts, w, t, s), dtype=np.int64)
        before.append(communication_volume(g, a, parts))
        if refine == "fast":
            a = _refine_fast(g, a, parts, w, t, float(ufactor), ROUNDS, s)
        elif refine is not None:
            a = _refine(g, a, parts, w, t, float(ufactor), PASSES, WINDOW, s)
        after.append(communication_volume(g, a, parts))
        if not by_volume:
            if rows is None:
                rows = np.repeat(np.arange(a.size, dtype=np.int64), np.diff(g.indptr))
            cuts.append(int((a[rows] != a[g.indices]).sum() // 2))
        score = after[-1] if by_volume else cuts[-1]
        log.info("try seed %d: volume %d -> %d (%.1f s)", s, before[-1], after[-1],
                 time.perf_counter() - tic)  # fmt: skip
        if best_score is None or score < best_score:
            best, best_score, best_seed = a, score, s
    record: dict[str, Any] = {"refine": refine, "tries": len(seeds), "try_seeds": seeds,
                              "best_seed": int(best_seed), "try_volumes": after}  # fmt: skip
    if refine is not None:
        record["try_volumes_unrefined"] = before
    if cuts:
        record["try_edge_cuts"] = cuts
    return best, record
