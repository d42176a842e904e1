"""Partition quality, vectorised: balance, edge cut, communication volume, halos, contiguity.

Definitions (gpmetis' where they exist):

- imbalance: ``max_p load_p / (target_p * total)`` over parts with a positive target (1.0 is
  perfect); by count and, with weights, by weight.
- edge cut: undirected graph edges whose ends lie in different shards.
- communication volume (METIS ``-objtype=vol``): sum over vertices ``v`` of the number of
  *other* shards holding a neighbour of ``v``.
- halo size of shard ``p``: distinct vertices of other shards adjacent to ``p`` (1-ring ghosts).
- ghost rows at depth ``d``: distinct (shard, outside vertex) pairs with the vertex within ``d``
  hops of the shard: the rows a ``d``-ring refresh moves (``d = 1`` is the halo volume; a GNN
  whose layers refresh a ``k``-ring halo pays depth ``k``).
- neighbours of shard ``p``: shards sharing at least one edge with ``p``.
- components of shard ``p``: connected components of the subgraph induced by ``p``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from meshshard.partition._validation import as_points, check_graph, check_weights, unique_int
from meshshard.partition.halo import ghost_keys

if TYPE_CHECKING:
    from meshshard.partition.record import Partition

__all__ = ["metrics"]


def _targets(part: Partition) -> np.ndarray:
    t = part.params.get("targets") if isinstance(part.params, dict) else None
    if t is not None and len(t) == part.nparts:
        return np.asarray(t, dtype=np.float64)
    return np.full(part.nparts, 1.0 / part.nparts)


def _imbalance(loads: np.ndarray, targets: np.ndarray) -> tuple[float, int]:
    total = float(loads.sum())
    live = targets > 0
    if total == 0 or not live.any():
        return 1.0, 0
    ratio = np.zeros_like(loads, dtype=np.float64)
    ratio[live] = loads[live] / (targets[live] * total)
    worst = int(np.argmax(ratio))
    return float(ratio[worst]), worst


def _stats(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"min": 0, "max": 0, "mean": 0.0}
    return {"min": int(values.min()), "max": int(values.max()), "mean": float(values.mean())}


def metrics(
    partition: Partition,
    graph: Any = None,
    points: Any = None,
    weights: Any = None,
    *,
    depths: Any = (1, 2),
    plan: Any = None,
) -> dict[str, Any]:
    """Quality numbers of ``partition`` as a JSON-serialisable dict.

    Parameters
    ----------
    partition : Partition
    graph : scipy.sparse matrix of shape (N, N), optional
        Symmetric adjacency in *original* row order (e.g. :func:`knn_graph`,
        :func:`dual_graph`); enables edge cut, communication volume, halos, neighbours and
        components.
    points : array of shape (N, D), optional
        Original-order coordinates; enables per-shard bounding boxes.
    weights : array of shape (N,), optional
        Per-point work for the weighted imbalance.
    depths : sequence of int
        Refresh depths (rings) whose ghost rows are counted along ``graph``.
    plan : HaloPlan, optional
        A halo plan of this partition: its ghost rows are reported as ``ghost_rows_plan`` and,
        for a graph plan of ``k`` rings, depth ``k`` is added to ``depths``.

    Returns
    -------
    dict
        Keys: ``parts``, ``num_points``, ``method``, ``sizes``, ``imbalance``,
        ``most_overweight_part``, ``empty_parts`` and, when available, ``imbalance_weighted``,
        ``num_edges``, ``edge_cut``, ``comm_volume``, ``halo_sizes``, ``halo_volume``,
        ``neighbours`` (per shard), ``neighbours_stats``, ``components`` (per shard),
        ``noncontiguous_parts``, ``ghost_rows`` (``{"1": ..., "2": ...}``, one entry per
        depth), ``ghost_rows_plan``, ``bbox_min``/``bbox_max`` (per shard, None when empty).

    Examples
    --------
    >>> import numpy as np
    >>> from meshshard.partition import knn_graph, partition
    >>> pts = np.random.default_rng(0).random((1000, 3))
    >>> m = metrics(partition(pts, 4), graph=knn_graph(pts, 8))
    >>> m["edge_cut"] > 0
    True
    """
    P, n = partition.nparts, partition.num_points
    a = partition.assignment
    targets = _targets(partition)
    sizes = partition.sizes
    imb, worst = _imbalance(sizes.astype(np.float64), targets)
    out: dict[str, Any] = {
        "parts": P,
        "num_points": n,
        "method": partition.method,
        "sizes": sizes.tolist(),
        "size_min": int(sizes.min()),
        "size_max": int(sizes.max()),
        "targets": targets.tolist(),
        "imbalance": imb,
        "most_overweight_part": worst,
        "empty_parts": int((sizes == 0).sum()),
    }
    w = check_weights(weights, n)
    if w is not None:
        loads = np.bincount(a, weights=w, minlength=P)
        wimb, wworst = _imbalance(loads, targets)
        out["loads"] = loads.tolist()
        out["imbalance_weighted"] = wimb
        out["most_overweight_part"] = wworst
    want = _depths(depths, plan, partition)
    if graph is not None:
        g = check_graph(graph, n)
        out.update(_graph_metrics(g, a, P))
        if want:
            keys = ghost_keys(a, g, max(want))
            out["ghost_rows"] = {str(d): int(keys[d - 1].size) for d in want}
    if plan is not None:
        out["ghost_rows_plan"] = int(np.asarray(plan.halo_sizes()).sum())
        out["ghost_rows_plan_kind"] = {"kind": plan.kind, **dict(plan.params)}
    if points is not None:
        pts = as_points(points)
        if pts.shape[0] != n:
            msg = f"points has {pts.shape[0]} rows; the partition has N={n}"
            raise ValueError(msg)
        out.update(_bboxes(partition, pts))
    return out


def _depths(depths: Any, plan: Any, partition: Partition) -> list[int]:
    """Validated, sorted refresh depths (plus a graph plan's rings)."""
    vals = [] if depths is None else list(depths)
    for d in vals:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            msg = f"depths={depths!r}: every depth must be an int >= 1 (rings of a refresh)"
            raise ValueError(msg)
    if plan is not None:
        if int(plan.offsets[-1]) != partition.num_points or plan.nparts != partition.nparts:
            msg = (
                f"plan is for {plan.nparts} shards of {int(plan.offsets[-1])} rows; the "
                f"partition has {partition.nparts} shards of {partition.num_points}"
            )
            raise ValueError(msg)
        if plan.kind == "graph" and "rings" in plan.params:
            vals.append(int(plan.params["rings"]))
    return sorted({int(d) for d in vals})


def _graph_metrics(g: Any, a: np.ndarray, P: int) -> dict[str, Any]:
    from scipy.sparse import csgraph

    n = g.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.indptr))
    cols = g.indices.astype(np.int64)
    pr, pc = a[rows], a[cols]
    cut = pr != pc
    num_edges = int(rows.size // 2)
    edge_cut = int(cut.sum() // 2)
    # communication volume: distinct (vertex, other shard) pairs
    comm = unique_int(rows[cut] * P + pc[cut]).size
    # halo of shard p: distinct outside vertices adjacent to p
    halo_pairs = unique_int(pr[cut] * n + cols[cut])
    halo_sizes = np.bincount(halo_pairs // n, minlength=P)
    # neighbouring shards
    shard_pairs = unique_int(pr[cut] * P + pc[cut])
    neighbours = np.bincount(shard_pairs // P, minlength=P)
    # components of each shard's induced subgraph (each component lies inside one shard)
    import scipy.sparse as sp

    keep = ~cut
    inner = sp.csr_matrix(
        (np.ones(int(keep.sum()), dtype=np.int8), (rows[keep], cols[keep])), shape=(n, n)
    )
    ncomp, labels = csgraph.connected_components(inner, directed=False)
    part_of_component = np.zeros(ncomp, dtype=np.int64)
    part_of_component[labels] = a
    components = np.bincount(part_of_component, minlength=P) if n else np.zeros(P, np.int64)
    return {
        "num_edges": num_edges,
        "edge_cut": edge_cut,
        "edge_cut_fraction": edge_cut / num_edges if num_edges else 0.0,
        "comm_volume": int(comm),
        "halo_sizes": halo_sizes.tolist(),
        "halo_volume": int(halo_sizes.sum()),
        "neighbours": neighbours.tolist(),
        "neighbours_stats": _stats(neighbours),
        "components": components.tolist(),
        "noncontiguous_parts": int((components > 1).sum()),
    }


def _bboxes(partition: Partition, pts: np.ndarray) -> dict[str, Any]:
    stored = pts[partition.order]
    off = partition.offsets
    lo: list[list[float] | None] = []
    hi: list[list[float] | None] = []
    nonempty = np.flatnonzero(partition.sizes > 0)
    mins = np.minimum.reduceat(stored, off[nonempty], axis=0) if nonempty.size else None
    maxs = np.maximum.reduceat(stored, off[nonempty], axis=0) if nonempty.size else None
    j = 0
    for p in range(partition.nparts):
        if partition.sizes[p] == 0:
            lo.append(None)
            hi.append(None)
            continue
        lo.append(mins[j].tolist())
        hi.append(maxs[j].tolist())
        j += 1
    return {"bbox_min": lo, "bbox_max": hi}
