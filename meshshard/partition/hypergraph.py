"""Hypergraph partitioning on the connectivity objective with Mt-KaHyPar (optional backend,
``pip install -e '.[hypergraph]'``).

Why: a halo refresh moves the *ghost rows*, the distinct (shard, outside row) pairs, not the cut
edges. Give every vertex ``v`` one net holding ``v`` and every vertex within ``rings`` hops of it.
The connectivity objective (λ − 1) of that hypergraph, summed over nets, is then exactly the number
of ghost rows of a ``rings``-deep refresh: net ``u`` is counted once for every other shard that
needs ``u``. Mt-KaHyPar minimises it directly (``Objective.KM1``); METIS' ``objtype=vol``
approximates it for ``rings=1`` only.

Reproducibility: only Mt-KaHyPar's deterministic presets (``"deterministic"``,
``"deterministic_quality"``, and meshshard's ``"deterministic_quality_fast"``) give the same
partition for the same seed on every run; ``"default"``, ``"quality"`` and ``"highest_quality"``
differ from run to run even on one thread with a fixed seed (measured, mtkahypar 1.7). Since
meshshard promises the same partition on every run and rank, those need ``deterministic=False``.
Mt-KaHyPar keeps its thread pool for the life of the process, so the first ``threads`` value is
kept; asking for another later raises.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from meshshard.partition._validation import check_epsilon, check_int
from meshshard.partition.graphpart import check_refine, metis_assignment, partition_on_graph
from meshshard.partition.mtk_presets import CONFIGS, context_from_config
from meshshard.partition.record import Partition

__all__ = ["INITS", "PRESETS", "WITH_MTKAHYPAR", "hypergraph", "hypergraph_assignment", "nets_of"]

log = logging.getLogger(__name__)

try:  # detected once, at import
    import mtkahypar as _mtk

    WITH_MTKAHYPAR = True
except Exception:  # ImportError, or a broken binary build
    _mtk = None
    WITH_MTKAHYPAR = False

PRESETS = ("deterministic", "deterministic_quality", "deterministic_quality_fast", "default",
           "quality", "highest_quality")  # fmt: skip
"""Presets, mapped to Mt-KaHyPar's of the same names (``PresetType.DETERMINISTIC`` ...), but
``"deterministic_quality_fast"``: ``deterministic_quality``'s algorithms with cheaper settings
(:mod:`meshshard.partition.mtk_presets`; about its ghost rows for half its CPU or less).
The three ``deterministic*`` are reproducible for a seed; ``"default"``,
``"quality"`` (adds flow-based refinement) and ``"highest_quality"`` (n-level, slowest) are not,
and need ``deterministic=False``."""

REPRODUCIBLE = ("deterministic", "deterministic_quality", "deterministic_quality_fast")

INITS = (None, "metis")
"""Where the multilevel search starts: ``None`` (Mt-KaHyPar's own initial partition) or
``"metis"`` (METIS ``objtype=vol``, then ``vcycles`` Mt-KaHyPar V-cycles on it)."""

_PRESET_NAMES = {
    "deterministic": "DETERMINISTIC",
    "deterministic_quality": "DETERMINISTIC_QUALITY",
    "default": "DEFAULT",
    "quality": "QUALITY",
    "highest_quality": "HIGHEST_QUALITY",
}
_WEIGHT_SCALE = 1000
_STATE: dict[str, Any] = {}  # the Initializer and its thread count (one per process)


def require_mtkahypar() -> Any:
    """Return the ``mtkahypar`` module or raise an ImportError saying how to get it."""
    if not WITH_MTKAHYPAR:
        msg = (
            "method='hypergraph' needs the mtkahypar package, which is not installed; in the "
            "meshshard checkout run "
            "`pip install -e '.[hypergraph]'` (or `pip install mtkahypar`), or use "
            "method='metis' with objective='vol'"
        )
        raise ImportError(msg)
    return _mtk


def _initializer(threads: int) -> Any:
    mk = require_mtkahypar()
    if "init" not in _STATE:
        _STATE["init"], _STATE["threads"] = mk.initialize(int(threads)), int(threads)
    elif _STATE["threads"] != int(threads):
        msg = (
            f"threads={threads}: Mt-KaHyPar was already started with threads={_STATE['threads']} "
            "in this process and cannot change it; pass the same threads (or start a new process)"
        )
        raise ValueError(msg)
    return _STATE["init"]


def check_options(preset: Any, epsilon: Any, threads: Any, seed: Any, rings: Any, init: Any,
                  vcycles: Any, deterministic: Any = True) -> None:  # fmt: skip
    """One place for the option checks, before Mt-KaHyPar sees them."""
    if preset not in PRESETS:
        msg = f"preset={preset!r} is not one of {PRESETS}"
        raise ValueError(msg)
    if deterministic and preset not in REPRODUCIBLE:
        msg = (
            f"preset={preset!r} gives a different partition on every run, even with one thread "
            "and a fixed seed; pass deterministic=False to accept that, or use preset="
            "'deterministic' or 'deterministic_quality'"
        )
        raise ValueError(msg)
    check_epsilon(epsilon)
    check_int("threads", threads, 1)
    check_int("seed", seed, 0)
    check_int("rings", rings, 1)
    check_int("vcycles", vcycles, 0)
    if init not in INITS:
        msg = f"init={init!r} is not one of {INITS}: use None or 'metis'"
        raise ValueError(msg)


def nets_of(graph: Any, rings: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The nets of a ``rings``-deep refresh as CSR ``(ptr, pins)``: net ``v`` holds ``v`` and
    every vertex within ``rings`` hops of it along ``graph`` (sorted)."""
    import scipy.sparse as sp

    n = graph.shape[0]
    a = sp.csr_matrix(
        (np.ones(graph.indices.size, dtype=np.int8), graph.indices, graph.indptr), shape=(n, n)
    )
    step = (a + sp.identity(n, dtype=np.int8, format="csr")).tocsr()
    step.data[:] = 1
    ball = step
    for _ in range(int(rings) - 1):
        ball = (ball @ step).tocsr()
        ball.data[:] = 1
    ball.sort_indices()
    return ball.indptr.astype(np.int64), ball.indices.astype(np.int64)


def _int_weights(w: np.ndarray) -> np.ndarray:
    scaled = np.rint(w / w.max() * _WEIGHT_SCALE) if w.max() > 0 else np.zeros_like(w)
    scaled[(w > 0) & (scaled < 1)] = 1
    return scaled.astype(np.int64)


def hypergraph_assignment(graph: Any, parts: int, *, weights: np.ndarray | None = None,
                          targets: np.ndarray | None = None, rings: int = 1,
                          preset: str = "deterministic", epsilon: float = 0.03, seed: int = 0,
                          threads: int = 1, init: str | None = None, vcycles: int = 0,
                          deterministic: bool = True,
                          nets: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Shard label per vertex from Mt-KaHyPar (KM1) on a validated CSR graph.

    Parts with a zero target are left out (they stay empty). ``nets`` may pass
    :func:`nets_of` ``(graph, rings)`` when it was built already.
    """
    check_options(preset, epsilon, threads, seed, rings, init, vcycles, deterministic)
    mk = require_mtkahypar()
    n = graph.shape[0]
    t = np.full(parts, 1.0 / parts) if targets is None else np.asarray(targets, dtype=np.float64)
    live = np.flatnonzero(t > 0)
    if live.size == 1 or n == 0:
        return np.full(n, live[0], dtype=np.int64)
    if live.size >= n:
        return live[np.arange(n)]
    k = int(live.size)
    ip = _initializer(threads)
    if preset in CONFIGS:
        ctx = context_from_config(ip, preset)
    else:
        ctx = ip.context_from_preset(getattr(mk.PresetType, _PRESET_NAMES[preset]))
    ctx.set_partitioning_parameters(k, float(epsilon), mk.Objective.KM1)
    ctx.logging = False
    vw = np.ones(n, dtype=np.int64) if weights is None else _int_weights(weights)
    tp = t[live] / t[live].sum()
    if not np.allclose(tp, 1.0 / k):
        total = float(vw.sum())
        caps = np.maximum(np.floor((1 + float(epsilon)) * tp * total), vw.max()).astype(np.int64)
        ctx.set_individual_target_block_weights(caps.tolist())
    ptr, pins = nets_of(graph, rings) if nets is None else nets
    # The seed relabels the vertices (seed 0: as given). Mt-KaHyPar's deterministic presets
    # take no seed from Python (``set_seed`` does not reach them), so a relabelling is what
    # makes tries explore; the others get the seed too.
    perm = np.arange(n) if seed == 0 else np.random.default_rng(int(seed)).permutation(n)
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)  # inv[new id] = old vertex
    counts = np.diff(ptr)[inv]
    net_ptr = np.concatenate([[0], np.cumsum(counts)])
    take = np.repeat(ptr[inv] - net_ptr[:-1], counts) + np.arange(int(net_ptr[-1]))
    net_list = np.split(perm[pins[take]], net_ptr[1:-1])
    mk.set_seed(int(seed))
    if weights is None:
        hg = ip.create_hypergraph(ctx, n, len(net_list), net_list)
    else:
        hg = ip.create_hypergraph(ctx, n, len(net_list), net_list, vw[inv].tolist(),
                                  [1] * len(net_list))  # fmt: skip
    if init == "metis":
        start = metis_assignment(graph, k, weights=weights, targets=tp,
                                 ufactor=int(round(1000 * float(epsilon))), seed=int(seed),
                                 objective="vol")  # fmt: skip
        phg = hg.create_partitioned_hypergraph(ctx, k, start[inv].tolist())
    else:
        phg = hg.partition(ctx)
    if vcycles:
        phg.improve_partition(ctx, int(vcycles))
    labels = np.asarray(phg.get_partition(), dtype=np.int64)[perm]
    log.debug("mtkahypar %s: %d parts, km1 %d", preset, k, phg.km1())
    return live[labels]


def hypergraph(points: Any, parts: int, *, weights: Any = None, targets: Any = None,
               allow_empty: bool = False, graph: Any = None, knn: int = 8, rings: int = 1,
               preset: str = "deterministic", epsilon: float = 0.03, seed: int = 0,
               threads: int = 1, init: str | None = None, vcycles: int = 0,
               deterministic: bool = True, refine: bool | str | None = None,
               tries: int = 1) -> Partition:  # fmt: skip
    """Partition for the fewest ghost rows: Mt-KaHyPar on the refresh hypergraph.

    Parameters
    ----------
    points : array of shape (N, 3) or (N, 2), or None
        Coordinates; used for the kNN graph when ``graph`` is None and to order rows inside
        each shard along a Hilbert curve. May be None when ``graph`` is given.
    parts : int
        Number of shards P >= 1 (P == 1 never calls Mt-KaHyPar).
    weights : array of shape (N,), optional
        Non-negative vertex weights (scaled to integers, relative precision 1e-3).
    targets : array of shape (P,), optional
        Target fraction per shard; zeros give empty shards.
    allow_empty : bool
        Allow empty shards when N < P.
    graph : scipy.sparse matrix of shape (N, N), optional
        Symmetric adjacency without self loops, e.g. :func:`dual_graph` of a mesh.
    knn : int
        Neighbours per point of the kNN graph built when ``graph`` is None.
    rings : int
        Refresh depth to optimise: net ``v`` is the ``rings``-hop ball of ``v``, so the objective
        equals the ghost rows of :func:`halo_plan_graph` ``(rings=rings)``.
    preset : str
        Mt-KaHyPar configuration, one of :data:`PRESETS`: ``"deterministic"``,
        ``"deterministic_quality"``, ``"deterministic_quality_fast"``, and ``"default"``,
        ``"quality"``, ``"highest_quality"``, which need ``deterministic=False``.
    epsilon : float
        Allowed imbalance: every shard holds at most ``(1 + epsilon)`` times its target.
    seed : int
        Random seed (with ``threads=1`` the result is deterministic for a fixed seed).
    threads : int
        Mt-KaHyPar threads; fixed for the process by the first call.
    init : {None, "metis"}
        ``"metis"``: start from METIS ``objtype=vol`` (same seed, same balance) and improve it with
        ``vcycles`` Mt-KaHyPar V-cycles, instead of Mt-KaHyPar's own multilevel partition.
    vcycles : int
        Extra V-cycles (coarsen the current partition, refine it back) after the partition.
    deterministic : bool
        Refuse presets whose result changes from run to run (True, the default).
    refine : {None, "volume", "fast"} or bool
        ``"volume"``: meshshard's k-way FM on the 1-ring volume afterwards; ``"fast"``: the
        vectorised refinement (:mod:`meshshard.partition.fastrefine`); only for ``rings=1``.
    tries : int
        Runs with seeds ``seed .. seed + tries - 1``; the fewest 1-ring ghost rows are kept.

    Returns
    -------
    Partition

    Raises
    ------
    ImportError
        mtkahypar is not installed (``pip install -e '.[hypergraph]'``).
    ValueError
        Bad graph, sizes, weights or targets; an unknown ``preset`` or ``init``; ``epsilon``
        outside (0, 1); ``threads``/``rings`` < 1, ``seed``/``vcycles`` < 0, ``tries`` < 1;
        ``refine`` with ``rings`` > 1.

    Examples
    --------
    >>> import numpy as np
    >>> p = hypergraph(np.random.default_rng(0).random((500, 3)), 4)  # doctest: +SKIP
    >>> int(p.sizes.sum())  # doctest: +SKIP
    500
    """
    check_options(preset, epsilon, threads, seed, rings, init, vcycles, deterministic)
    how = check_refine(refine, tries)
    if how is not None and int(rings) > 1:
        msg = f"refine={refine!r} lowers the 1-ring volume only; with rings={rings} leave it None"
        raise ValueError(msg)
    require_mtkahypar()
    params = {"preset": preset, "epsilon": float(epsilon), "seed": int(seed),
              "threads": int(threads), "rings": int(rings), "init": init,
              "vcycles": int(vcycles), "reproducible": preset in REPRODUCIBLE}  # fmt: skip
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def assign(g: Any, parts: int, w: np.ndarray | None, t: np.ndarray, s: int) -> np.ndarray:
        if id(g) not in cache:  # one net list for all tries
            cache.clear()
            cache[id(g)] = nets_of(g, rings)
        return hypergraph_assignment(g, parts, weights=w, targets=t, rings=rings,
                                     preset=preset, epsilon=epsilon, seed=s, threads=threads,
                                     init=init, vcycles=vcycles,
                                     deterministic=deterministic, nets=cache[id(g)])  # fmt: skip

    return partition_on_graph(points, parts, assign, "hypergraph", params, weights=weights,
                              targets=targets, allow_empty=allow_empty, graph=graph,
                              knn=knn, seeds=range(seed, seed + tries), refine=how,
                              ufactor=1000 * float(epsilon), keep="volume")  # fmt: skip
