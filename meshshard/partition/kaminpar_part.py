"""KaMinPar graph partitioning (optional backend, ``pip install -e '.[kaminpar]'``).

Same inputs as :func:`meshshard.partition.graphpart.metis`: a symmetric CSR graph (e.g. the
mesh :func:`dual_graph`) or a kNN graph of the points, ``parts``, weights, targets. KaMinPar's
Python bindings (``kaminpar`` 3.7) cannot take a graph from memory: ``kaminpar.Graph`` has no
constructor and ``load_graph`` is the only way to make one (the separate ``kaminpar-networkit``
package takes a NetworKit graph, which would add NetworKit as a dependency and one more copy).
So the validated graph is written to a temporary file in KaMinPar's binary ParHiP format
(header, offsets, neighbours, vertex weights, as raw 64-bit arrays: no text formatting), on a
memory file system (``/dev/shm``) where there is one. That costs ~0.05 s per million vertices,
against ~5 s for the METIS text format used before. One thread and a fixed seed make the result
deterministic.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import numpy as np

from meshshard.partition._validation import check_epsilon, check_int
from meshshard.partition.graphpart import check_refine, partition_on_graph
from meshshard.partition.record import Partition

__all__ = ["PRESETS", "WITH_KAMINPAR", "kaminpar", "kaminpar_assignment"]

log = logging.getLogger(__name__)

try:  # detected once, at import
    import kaminpar as _kaminpar

    WITH_KAMINPAR = True
except Exception:  # ImportError, or a broken binary build
    _kaminpar = None
    WITH_KAMINPAR = False

PRESETS = ("fast", "default", "strong", "eco", "strong_rows")
"""KaMinPar presets: ``"default"``; ``"eco"`` and ``"strong"`` refine more (slower, fewer
cut edges); ``"fast"`` refines less. ``"strong_rows"`` (meshshard's, for the fewest ghost
rows): ``"strong"``, then ``refine="fast"``
(:func:`meshshard.partition.fastrefine.refine_volume_fast`); measured 4-7 % fewer ghost rows
than ``"strong"`` for 2-19 % more CPU (docs/hypergraph-partitioning.md)."""

ROW_PRESETS = {"strong_rows": "strong"}
"""meshshard presets: the KaMinPar preset each runs, followed by ``refine="fast"``."""

_WEIGHT_SCALE = 1000


def require_kaminpar():
    """Return the ``kaminpar`` module or raise an ImportError saying how to get it."""
    if not WITH_KAMINPAR:
        msg = (
            "method='kaminpar' needs the kaminpar package, which is not installed; in the "
            "meshshard checkout run `pip install -e '.[kaminpar]'` (or `pip install kaminpar`), "
            "or use method='metis'"
        )
        raise ImportError(msg)
    return _kaminpar


def _check_options(preset: Any, epsilon: Any, threads: Any, seed: Any) -> None:
    """One place for the option checks, before KaMinPar sees them."""
    if preset not in PRESETS:
        msg = (f"preset={preset!r} is not one of {PRESETS}: use 'default', 'strong', 'eco', "
               "'fast' or 'strong_rows'")
        raise ValueError(msg)
    check_epsilon(epsilon)
    check_int("threads", threads, 1)
    check_int("seed", seed, 0)


def _write_parhip(path: str, graph: Any, vweights: np.ndarray | None) -> None:
    """Write a CSR graph in ParHiP binary format: 64-bit ids, no edge weights, vertex weights
    when given. Header: version bits (bit 0: no edge weights, bit 1: no vertex weights), n, m
    (directed edges); then n + 1 offsets in bytes from the start of the file, the neighbours,
    and the vertex weights."""
    n = graph.shape[0]
    indptr = graph.indptr.astype(np.int64)
    m = int(indptr[-1])
    version = 1 if vweights is not None else 3
    header = np.array([version, n, m], dtype=np.uint64)
    first = 3 * 8 + (n + 1) * 8  # byte where the neighbour lists begin
    with open(path, "wb") as f:
        header.tofile(f)
        (first + 8 * indptr).astype(np.uint64).tofile(f)
        graph.indices.astype(np.uint64).tofile(f)
        if vweights is not None:
            np.asarray(vweights, dtype=np.int64).tofile(f)


def _temp_dir() -> str | None:
    """A memory file system for the graph file when there is one (``/dev/shm``)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def kaminpar_assignment(
    graph: Any,
    parts: int,
    *,
    weights: np.ndarray | None = None,
    targets: np.ndarray | None = None,
    preset: str = "default",
    epsilon: float = 0.03,
    seed: int = 0,
    threads: int = 1,
) -> np.ndarray:
    """Shard label per vertex from KaMinPar on a validated CSR graph.

    Parts with a zero target are left out (they stay empty). KaMinPar's own presets only
    (``"strong_rows"`` adds a refinement: use :func:`kaminpar`).
    """
    _check_options(preset, epsilon, threads, seed)
    if preset in ROW_PRESETS:
        msg = f"preset={preset!r} refines after KaMinPar: call kaminpar(), not this function"
        raise ValueError(msg)
    kp = require_kaminpar()
    n = graph.shape[0]
    t = np.full(parts, 1.0 / parts) if targets is None else targets
    live = np.flatnonzero(t > 0)
    if live.size == 1 or n == 0:
        return np.full(n, live[0], dtype=np.int64)
    if live.size >= n:
        return live[np.arange(n)]
    if weights is None:
        vw = None
    else:
        vw = np.rint(weights / weights.max() * _WEIGHT_SCALE).astype(np.int64)
        vw[(weights > 0) & (vw < 1)] = 1
    fd, path = tempfile.mkstemp(suffix=".parhip", prefix="meshshard-kaminpar-", dir=_temp_dir())
    os.close(fd)
    try:
        _write_parhip(path, graph, vw)
        g = kp.load_graph(path, kp.GraphFileFormat.PARHIP)
    finally:
        os.unlink(path)
    kp.reseed(int(seed))
    solver = kp.KaMinPar(int(threads), kp.context_by_name(preset))
    tp = t[live] / t[live].sum()
    if np.allclose(tp, 1.0 / live.size):
        labels = solver.compute_partition(g, int(live.size), float(epsilon))
    else:
        labels = solver.compute_partition(g, [float(x) * (1 + float(epsilon)) for x in tp])
    labels = np.asarray(labels, dtype=np.int64)
    log.debug("kaminpar %s: %d parts, edge cut %d", preset, live.size, kp.edge_cut(g, labels))
    return live[labels]


def kaminpar(points: Any, parts: int, *, weights: Any = None, targets: Any = None,
             allow_empty: bool = False, graph: Any = None, knn: int = 8, preset: str = "default",
             epsilon: float = 0.03, seed: int = 0, threads: int = 1,
             refine: bool | str | None = None, tries: int = 1) -> Partition:  # fmt: skip
    """Partition with KaMinPar on a graph of the points (or cells).

    Parameters
    ----------
    points, parts, weights, targets, allow_empty, graph, knn
        As for :func:`meshshard.partition.metis`: coordinates (or None with a ``graph``), the
        number of shards (P == 1 never calls KaMinPar), vertex weights (scaled to integers,
        relative precision 1e-3), per-shard target fractions, empty shards when N < P, a
        symmetric adjacency without self loops, and the kNN graph's neighbours per point.
    preset : {"default", "strong", "eco", "fast", "strong_rows"}
        KaMinPar configuration; ``"strong"`` cuts fewest edges, slowest; ``"strong_rows"``:
        ``"strong"`` then ``refine="fast"``, for the fewest ghost rows (:data:`PRESETS`).
    epsilon : float
        Allowed imbalance: every shard holds at most ``(1 + epsilon)`` times its target.
    seed : int
        Random seed (with ``threads=1`` the result is deterministic for a fixed seed).
    threads : int
        KaMinPar threads (more threads: faster, not bit-reproducible).
    refine : {None, "volume", "fast"} or bool
        ``"volume"`` (or True): lower the ghost rows afterwards with k-way FM within
        ``epsilon`` (as :func:`meshshard.partition.graphpart.metis`); ``"fast"``: with the
        vectorised :func:`meshshard.partition.fastrefine.refine_volume_fast` instead.
    tries : int
        Runs with seeds ``seed .. seed + tries - 1``; keeps the fewest ghost rows with
        ``refine``, else the smallest edge cut (recorded in ``params``).

    Returns
    -------
    Partition

    Raises
    ------
    ImportError
        kaminpar is not installed (``pip install -e '.[kaminpar]'``).
    ValueError
        Asymmetric or self-looped graph, mismatched sizes, bad weights/targets, an unknown
        ``preset``, ``epsilon`` outside (0, 1), ``threads`` < 1, ``seed`` < 0, ``refine``
        not None/bool/"volume"/"fast", ``tries`` < 1.

    Examples
    --------
    >>> import numpy as np
    >>> p = kaminpar(np.random.default_rng(0).random((500, 3)), 4)  # doctest: +SKIP
    >>> int(p.sizes.sum())  # doctest: +SKIP
    500
    """
    _check_options(preset, epsilon, threads, seed)
    base = ROW_PRESETS.get(preset, preset)
    if preset in ROW_PRESETS:
        if refine is False or refine is True or refine == "volume":
            msg = (f"preset={preset!r} is preset={base!r} followed by refine='fast'; pass no "
                   f"refine with it, or preset={base!r} with the refine you want")  # fmt: skip
            raise ValueError(msg)
        refine = "fast"
    how = check_refine(refine, tries)
    require_kaminpar()
    params = {"preset": preset, "epsilon": float(epsilon), "seed": int(seed),
              "threads": int(threads)}  # fmt: skip

    def assign(g: Any, parts: int, w: np.ndarray | None, t: np.ndarray, s: int) -> np.ndarray:
        return kaminpar_assignment(g, parts, weights=w, targets=t, preset=base,
                                   epsilon=epsilon, seed=s, threads=threads)  # fmt: skip

    return partition_on_graph(points, parts, assign, "kaminpar", params, weights=weights,
                              targets=targets, allow_empty=allow_empty, graph=graph,
                              knn=knn, seeds=range(seed, seed + tries), refine=how,
                              ufactor=1000 * float(epsilon))  # fmt: skip
