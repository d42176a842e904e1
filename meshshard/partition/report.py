"""A gpmetis-like report of a partition: :func:`report` (dict), :func:`format_report` (text),
:func:`render_png` (the geometry coloured by shard, off-screen).

The pipelines package reuses these for ``meshshard inspect run_i.zarr``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition.quality import metrics
from meshshard.partition.record import Partition

__all__ = ["format_report", "render_png", "report", "shard_palette"]


def report(
    partition: Partition,
    graph: Any = None,
    points: Any = None,
    weights: Any = None,
    *,
    timings: dict[str, float] | None = None,
    source: str | None = None,
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

    Returns
    -------
    dict
        :func:`meshshard.partition.metrics` plus ``params``, ``timings`` and ``source``.
    """
    d = metrics(partition, graph=graph, points=points, weights=weights)
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
    worst = d["most_overweight_part"]
    lines.append(f"  most overweight part: {worst} ({_n(sizes[worst])} rows)")
    if "edge_cut" in d:
        lines.append(
            f"  edge cut: {_n(d['edge_cut'])} of {_n(d['num_edges'])} edges "
            f"({100 * d['edge_cut_fraction']:.2f}%)"
        )
        lines.append(f"  communication volume: {_n(d['comm_volume'])}")
        halo = np.asarray(d["halo_sizes"])
        lines.append(
            f"  halo volume: {_n(d['halo_volume'])} ghost rows "
            f"(per part min {_n(halo.min())}, max {_n(halo.max())}, avg {halo.mean():,.1f})"
        )
        nb = d["neighbours_stats"]
        lines.append(
            f"  neighbours per part: max {nb['max']}, min {nb['min']}, avg {nb['mean']:.2f}"
        )
        comp = np.asarray(d["components"])
        lines.append(
            f"  contiguity: {d['noncontiguous_parts']} of {d['parts']} parts non-contiguous "
            f"(components per part max {int(comp.max()) if comp.size else 0})"
        )
    else:
        lines.append("  (no graph: edge cut, volume, halos and contiguity not computed)")
    if d.get("timings"):
        t = ", ".join(f"{k} {v:.3f} s" for k, v in d["timings"].items())
        lines.append(f"  time: {t}")
    return "\n".join(lines)


def shard_palette(parts: int) -> np.ndarray:
    """Categorical colours, shape (parts, 3) uint8: tab10/tab20, else a spread of hues."""
    import matplotlib

    if parts <= 10:
        rgb = np.asarray(matplotlib.colormaps["tab10"].colors)[:parts]
    elif parts <= 20:
        rgb = np.asarray(matplotlib.colormaps["tab20"].colors)[:parts]
    else:
        golden = (np.arange(parts) * 0.6180339887) % 1.0  # neighbours in id get distant hues
        rgb = matplotlib.colormaps["turbo"](0.05 + 0.9 * golden)[:, :3]
    return np.round(np.asarray(rgb) * 255).astype(np.uint8)


def render_png(
    partition: Partition,
    path: str | Path,
    *,
    mesh: Any = None,
    points: Any = None,
    on: str = "cells",
    window_size: tuple[int, int] = (1024, 768),
) -> Path:
    """Render the geometry coloured by shard (off-screen) and save a PNG.

    Parameters
    ----------
    partition : Partition
        Over the mesh's cells (``on="cells"``), its points (``on="points"``), or ``points``.
    path : str or Path
        Output PNG.
    mesh : pyvista.DataSet, optional
    points : array of shape (N, 3) or (N, 2), optional
        Used when ``mesh`` is None.
    on : {"cells", "points"}
    window_size : (int, int)

    Returns
    -------
    Path
    """
    import pyvista as pv

    path = Path(path)
    shard = partition.assignment.astype(np.int64)
    colours = shard_palette(partition.nparts)
    if mesh is None:
        pts = np.asarray(points, dtype=np.float64)
        if pts.shape[1] == 2:
            pts = np.c_[pts, np.zeros(len(pts))]
        geom = pv.PolyData(pts)
        geom.point_data["shard"] = shard
        style = {"render_points_as_spheres": True, "point_size": 6}
    else:
        geom = mesh.copy(deep=False)
        (geom.cell_data if on == "cells" else geom.point_data)["shard"] = shard
        style = {}
    pl = pv.Plotter(off_screen=True, window_size=list(window_size))
    pl.background_color = "white"
    pl.add_mesh(
        geom,
        scalars="shard",
        preference="cell" if (mesh is not None and on == "cells") else "point",
        categories=True,
        cmap=[f"#{r:02x}{g:02x}{b:02x}" for r, g, b in colours],
        clim=[0, max(partition.nparts - 1, 1)],
        n_colors=partition.nparts,
        lighting=False,
        scalar_bar_args={
            "fmt": "%.0f", "title": "shard", "color": "black", "vertical": True,
            "position_x": 0.88, "position_y": 0.1, "height": 0.8,
            "n_labels": min(partition.nparts, 11),
        },  # fmt: skip
        **style,
    )
    pl.view_isometric()
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.screenshot(str(path))
    pl.close()
    return path
