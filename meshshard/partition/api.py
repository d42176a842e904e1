"""The front door: :func:`partition` dispatches to a registered method by name."""

from __future__ import annotations

from typing import Any

from meshshard.partition.methods import list_methods, register_method, resolve_method
from meshshard.partition.record import Partition

__all__ = ["list_methods", "partition", "register_method"]


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
    method : {"hilbert", "morton", "rcb", "metis", "kaminpar", "hypergraph"} or a registered name
        ``"metis"`` takes ``graph=`` (scipy.sparse adjacency, e.g. from :func:`dual_graph`)
        or builds a symmetric kNN graph (``knn=8``) of the points; ``"kaminpar"`` takes the
        same graphs (optional: ``pip install meshshard[kaminpar]``; ``preset``, ``epsilon``);
        ``"hypergraph"`` minimises the ghost rows of a ``rings``-deep refresh exactly, with
        Mt-KaHyPar on the same graphs (optional: ``pip install meshshard[hypergraph]``;
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
    fn = resolve_method(method)
    return fn(
        points, parts, weights=weights, targets=targets, allow_empty=allow_empty, **method_params
    )
