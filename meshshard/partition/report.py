"""A gpmetis-like report of a partition: :func:`report` (dict), :func:`format_report` (text),
:func:`render_png` (the shards in 3-D, their sizes and the numbers; see
:mod:`meshshard.partition.render`).

The pipelines package reuses these for ``meshshard inspect run_i.zarr``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshshard.partition.quality import metrics
from meshshard.partition.record import Partition
from meshshard.partition.render import render_png, shard_palette

__all__ = ["format_report", "render_png", "report", "shard_palette"]


def report(
    partition: Partition,
    graph: Any = None,
    points: Any = None,
    weights: Any = None,
    *,
    timings: dict[str, float] | None = None,
    source: str | None = None,
    depths: Any = (1, 2),
    plan: Any = None,
) -> dict[str, Any]:
    """Everything the inspector prints, as a JSON-serialisable dict.

    Parameters
    ----------
    partition : Partition
    graph : scipy.sparse matrix (N, N), optional
        Adjacency for cut, volume, halos, neighbours, contiguity.
    points : array of shape (N, D), optional
        Original-order coordinates for bounding boxes.
    weights : array of shape (N,), optional
        Per-point work for the weighted imbalance.
    timings : dict, optional
        Seconds per phase (e.g. ``{"partition": 0.3, "graph": 1.2}``).
    source : str, optional
        Where the data came from (file path), echoed in the report.
    depths : sequence of int
        Refresh depths whose ghost rows are reported (``ghost_rows``).
    plan : HaloPlan, optional
        A halo plan of the partition (its ghost rows, and its depth for a graph plan).

    Returns
    -------
    dict
        :func:`meshshard.partition.metrics` plus ``params``, ``timings`` and ``source``.
    """
    d = metrics(partition, graph=graph, points=points, weights=weights, depths=depths, plan=plan)
    d["params"] = dict(partition.params)
    d["timings"] = dict(timings or {})
    if source is not None:
        d["source"] = str(source)
    return d


def _n(v: Any) -> str:
    return f"{int(v):,}"


def format_report(d: dict[str, Any]) -> str:
    """Human-readable text of a :func:`report` dict, in the spirit of gpmetis' summary."""
    lines = []
    title = f"meshshard partition report: method={d.get('method')}"
    if d.get("source"):
        title += f"  source={d['source']}"
    lines.append(title)
    lines.append(
        f"  parts: {d['parts']}  points: {_n(d['num_points'])}  "
        f"empty parts: {d.get('empty_parts', 0)}"
    )
    sizes = np.asarray(d["sizes"])
    lines.append(
        f"  sizes: min {_n(sizes.min())}  max {_n(sizes.max())}  "
        f"mean {sizes.mean():,.1f}  imbalance (max/target) {d['imbalance']:.3f}"
    )
    if "imbalance_weighted" in d:
        lines.append(f"  weighted imbalance: {d['imbalance_weighted']:.3f}")
    if d.get("merged_points", {}).get("merged"):
        m = d["merged_points"]
        lines.append(
            f"  merged points: {_n(m['merged'])} coincident copies ({_n(m['points'])} -> "
            f"{_n(m['distinct'])} points; tolerance {m['tolerance']:.3g} = "
            f"{m['relative_to_shortest_edge']:g} x shortest edge)"
        )
    if d.get("coincident_points_not_merged"):
        lines.append(
            f"  WARNING: {_n(d['coincident_points_not_merged'])} points are copies of others "
            "and were not merged (--merge-tol 0): cells on either side of them are not "
            "neighbours in the dual graph"
        )
    worst = d["most_overweight_part"]
    lines.append(f"  most overweight part: {worst} ({_n(sizes[worst])} rows)")
    if "edge_cut" in d:
        if "num_edges" in d:
            lines.append(
                f"  edge cut: {_n(d['edge_cut'])} of {_n(d['num_edges'])} edges "
                f"({100 * d['edge_cut_fraction']:.2f}%)"
            )
        else:
            lines.append(f"  edge cut: {_n(d['edge_cut'])} edges")
        lines.append(f"  communication volume: {_n(d['comm_volume'])}")
        halo = np.asarray(d["halo_sizes"])
        lines.append(
            f"  halo volume: {_n(d['halo_volume'])} ghost rows "
            f"(per part min {_n(halo.min())}, max {_n(halo.max())}, avg {halo.mean():,.1f})"
        )
        if d.get("ghost_rows"):
            per = ", ".join(f"{k}-ring {_n(v)}" for k, v in d["ghost_rows"].items())
            lines.append(f"  ghost rows per refresh depth: {per}")
        nb = d["neighbours_stats"]
        lines.append(
            f"  neighbours per part: max {nb['max']}, min {nb['min']}, avg {nb['mean']:.2f}"
        )
        if "components" in d:
            comp = np.asarray(d["components"])
            lines.append(
                f"  contiguity: {d['noncontiguous_parts']} of {d['parts']} parts non-contiguous "
                f"(components per part max {int(comp.max()) if comp.size else 0})"
            )
        else:
            lines.append(f"  total edges, contiguity: {d.get('graph_metrics', 'not computed')}")
    elif d.get("graph_metrics"):
        lines.append(f"  edge cut, volume, halos and contiguity: {d['graph_metrics']}")
    else:
        lines.append("  (no graph: edge cut, volume, halos and contiguity not computed)")
    if "ghost_rows_plan" in d:
        kind = ", ".join(f"{k}={v}" for k, v in d.get("ghost_rows_plan_kind", {}).items())
        lines.append(f"  ghost rows of the halo plan ({kind}): {_n(d['ghost_rows_plan'])}")
    if d.get("timings"):
        t = ", ".join(f"{k} {v:.3f} s" for k, v in d["timings"].items())
        lines.append(f"  time: {t}")
    return "\n".join(lines)
