"""The front door: :func:`partition` dispatches to a registered method by name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from meshshard.partition.record import Partition

__all__ = ["list_methods", "partition", "register_method"]

# name -> "module:function" (imported on first use) or a callable registered at runtime.
_METHODS: dict[str, str | Callable[..., Partition]] = {
    "morton": "meshshard.partition.sfc:morton",
    "hilbert": "meshshard.partition.sfc:hilbert",
    "rcb": "meshshard.partition.rcb:rcb",
    "metis": "meshshard.partition.graphpart:metis",
    "kaminpar": "meshshard.partition.kaminpar_part:kaminpar",  # optional: meshshard[kaminpar]
    "hypergraph": "meshshard.partition.hypergraph:hypergraph",  # optional: meshshard[hypergraph]
}


def register_method(name: str, fn: Callable[..., Partition], *, override: bool = False) -> None:
    """Register ``fn(points, parts, *, weights, targets, allow_empty, **params) -> Partition``.

    Raises
    ------
    ValueError
        ``name`` is taken and ``override`` is False.
    """
    if name in _METHODS and not override:
        msg = f"method {name!r} is already registered; pass override=True to replace it"
        raise ValueError(msg)
    _METHODS[name] = fn


def list_methods() -> list[str]:
    """Names accepted by :func:`partition`'s ``method``."""
    return sorted(_METHODS)


def _resolve(method: str) -> Callable[..., Partition]:
    if not isinstance(method, str) or method not in _METHODS:
        msg = f"unknown method {method!r}; choose one of {', '.join(list_methods())}"
        raise ValueError(msg)
    target = _METHODS[method]
    if isinstance(target, str):
        mod, _, attr = target.partition(":")
        target = getattr(importlib.import_module(mod), attr)
    return target


def partition(
    points: Any,
    parts: int,
    method: str = "hilbert",
    *,
    weights: Any = None,
    targets: Any = None,
    allow_empty: bool = False,
    **method_params: Any,
) -> Partition:
    """Cut one sample's points into ``parts`` (possibly uneven) shards.

    Parameters
    ----------
    points : array (numpy or torch) of shape (N, 3) or (N, 2)
        Coordinates (use cell centres for a cell mesh).
    parts : int
        Number of shards P >= 1.
    method : {"hilbert", "morton", "rcb", "metis"} or a registered name
        ``"metis"`` takes ``graph=`` (scipy.sparse adjacency, e.g. from :func:`dual_graph`)
        or builds a symmetric kNN graph (``knn=8``) of the points; ``"kaminpar"`` takes the
        same graphs (optional: ``pip install -e '.[kaminpar]'``; ``preset``, ``epsilon``);
        ``"hypergraph"`` minimises the ghost rows of a ``rings``-deep refresh exactly, with
        Mt-KaHyPar on the same graphs (optional: ``pip install -e '.[hypergraph]'``;
        ``preset``, ``epsilon``, ``rings``, ``init``, ``vcycles``).
    weights : array of shape (N,), optional
        Non-negative per-point work to balance.
    targets : array of shape (P,), optional
        Fraction of the total weight per shard (heterogeneous devices); sums to 1; zeros
        give empty shards.
    allow_empty : bool
        Allow empty shards when N < P.
    **method_params
        Passed to the method (e.g. ``bits`` for SFCs; ``graph``, ``knn``, ``ufactor``,
        ``contig``, ``seed``, ``objective`` for METIS). ``"metis"`` and ``"kaminpar"`` also
        take ``refine="volume"`` (k-way FM that lowers the ghost rows, i.e. the communication
        volume, after the partitioner, within the same balance; never increases it) or
        ``refine="fast"`` (its vectorised, greedy counterpart: about as many rows, less time) and
        ``tries=k`` (k runs with seeds ``seed .. seed + k - 1``, the fewest ghost rows kept;
        per-try volumes recorded in ``Partition.params``), e.g.
        ``partition(centres, 4, "metis", graph=dual_graph(mesh), objective="vol",
        refine="volume", tries=4)``.

    Returns
    -------
    Partition

    Raises
    ------
    ValueError, TypeError
        Bad points, parts, weights, targets or method (messages say how to fix them).

    Examples
    --------
    >>> import numpy as np
    >>> pts = np.random.default_rng(0).random((1000, 3))
    >>> partition(pts, 4, method="rcb", targets=[0.4, 0.2, 0.2, 0.2]).sizes.tolist()
    [400, 200, 200, 200]
    """
    fn = _resolve(method)
    return fn(
        points, parts, weights=weights, targets=targets, allow_empty=allow_empty, **method_params
    )
