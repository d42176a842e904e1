"""Pictures of a partition that explain themselves: :func:`render_png`.

One PNG, three panels and a title:

- two 3-D views (pyvista, off-screen) coloured by shard. A volume mesh or a 3-D point cloud
  is shown *exploded* (every shard moved away from the centre along the direction of its
  centroid) and *cut open* (the half facing the camera removed, through the centre of the
  cells or, where a shard would still show in neither view, through a hidden shard's
  centroid), so shards inside the domain are visible; a surface is shown from two opposite
  sides; flat data from above;
- a bar chart of the part sizes against their targets, coloured like the shards, with a
  legend of the sizes;
- a title with the method, P, imbalance and edge cut.

VTK's messages while rendering (``bad X server connection. DISPLAY=`` before it falls back to
EGL) are captured, not printed. Heavy imports (pyvista, matplotlib) happen inside functions.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.io.vtklog import capture_vtk_output
from meshshard.partition.graph import CELL_FACES
from meshshard.partition.io import cell_centers
from meshshard.partition.record import Partition

__all__ = ["VIEW_BOXES", "render_png", "render_views", "shard_palette", "shown_shards"]

log = logging.getLogger(__name__)

#: figure size in pixels and where the 3-D views sit in it, as (x0, y0, x1, y1) pixel boxes
#: from the top left (tests crop these to check every shard's colour is visible); flat data
#: gets one view over both boxes
FIGSIZE_PX = (1800, 760)
VIEW_BOXES = ((10, 110, 650, 750), (660, 110, 1300, 750))
_VIEW_PX = 640
# cells rendered as surfaces up to this many; beyond, a sample of cell centres as points
_MAX_CELLS_AS_SURFACES = 2_000_000
_MAX_POINTS = 1_000_000
_EXPLODE = 0.7  # shift = factor * (part centroid - centre), relative to the domain


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


def _hex(c: np.ndarray) -> str:
    return "#{:02x}{:02x}{:02x}".format(*(int(v) for v in c))


def _is_volume(mesh: Any) -> bool:
    """Any 3-D cell (tetra, hexahedron, ...) in ``mesh``."""
    import pyvista as pv

    if isinstance(mesh, pv.PolyData):
        return False
    if isinstance(mesh, pv.ImageData | pv.RectilinearGrid | pv.StructuredGrid):
        return sum(d > 1 for d in mesh.dimensions) == 3
    types = np.asarray(mesh.celltypes)
    if types.size == 0:
        return False
    dims = [CELL_FACES.get(int(t), (2, ()))[0] for t in np.unique(types)]
    return max(dims) == 3


def _scene(
    partition: Partition, mesh: Any, points: Any, on: str
) -> tuple[str, Any, np.ndarray, np.ndarray]:
    """What to draw: ``(kind, data, centres, shard)``.

    ``kind`` is ``"cells"`` (``data`` a mesh with a ``shard`` cell array) or ``"points"``
    (``data`` an (M, 3) array, ``shard`` its labels); ``centres`` are the partitioned rows'
    coordinates (for centroids), padded to 3-D.
    """
    shard = partition.assignment.astype(np.int64)
    if mesh is not None and on == "cells" and mesh.n_cells <= _MAX_CELLS_AS_SURFACES:
        geom = mesh.copy(deep=False)
        geom.clear_data()
        geom.cell_data["shard"] = shard
        return "cells", geom, cell_centers(mesh), shard
    if points is None:
        points = mesh.points if on == "points" else mesh.cell_centers().points
    pts = np.asarray(points, dtype=np.float64)
    if pts.shape[1] == 2:
        pts = np.c_[pts, np.zeros(len(pts))]
    rows = _sample_rows(len(pts))
    return "points", pts[rows], pts, shard[rows]


def _sample_rows(n: int) -> np.ndarray:
    """All rows, or a fixed sample of ``_MAX_POINTS`` (big clouds stay quick to draw)."""
    rows = np.arange(n)
    if rows.size > _MAX_POINTS:
        rows = np.sort(np.random.default_rng(0).choice(rows.size, _MAX_POINTS, replace=False))
    return rows


def _surface(grid: Any) -> Any:
    """Outer faces of ``grid`` (VTK's dataset surface filter; what the renderer would draw)."""
    import pyvista as pv
    from vtkmodules.vtkFiltersGeometry import vtkDataSetSurfaceFilter

    f = vtkDataSetSurfaceFilter()
    f.SetInputData(grid)
    f.Update()
    return pv.wrap(f.GetOutput())


def _surfels(xyz: np.ndarray, normals: np.ndarray, areas: np.ndarray) -> Any:
    """One square patch per point, in the plane its ``normal`` defines: a surface drawn from
    cell centres alone (a store keeps no connectivity) that is opaque, not a cloud of
    see-through dots. The half-side is the larger of 0.65 sqrt(area) and 0.6 times the
    distance to the 10th-nearest centre, so long thin cells (rings of them) leave no gaps."""
    import pyvista as pv
    from scipy.spatial import cKDTree

    n = np.asarray(normals, dtype=np.float64)
    n /= np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-300)
    helper = np.where(np.abs(n[:, :1]) < 0.9, [[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]])
    u = np.cross(n, helper)
    u /= np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-300)
    v = np.cross(n, u)
    c = np.asarray(xyz, dtype=np.float64)
    h = 0.65 * np.sqrt(np.maximum(np.asarray(areas, dtype=np.float64), 0.0))
    if len(c) > 1:
        d4 = cKDTree(c).query(c, k=min(len(c), 11))[0][:, -1]
        h = np.maximum(h, 0.6 * d4)
    h = h[:, None]
    corners = np.stack([c - h * u - h * v, c + h * u - h * v, c + h * u + h * v,
                        c - h * u + h * v], axis=1).reshape(-1, 3)  # fmt: skip
    m = len(c)
    faces = np.c_[np.full(m, 4), np.arange(4 * m).reshape(m, 4)].ravel()
    return pv.PolyData(corners, faces=faces)


def _part_centroids(centres: np.ndarray, shard: np.ndarray, parts: int) -> np.ndarray:
    counts = np.bincount(shard, minlength=parts).astype(np.float64)
    sums = np.stack([np.bincount(shard, weights=centres[:, d], minlength=parts) for d in range(3)])
    return (sums / np.maximum(counts, 1)).T


def _view_direction(anchors: np.ndarray) -> np.ndarray:
    """A camera direction (unit, from above) that keeps the shards apart on the screen.

    Candidates are spread over the upper half-sphere; each is scored by the smallest distance
    between two projected shard ``anchors`` (e.g. exploded centroids), so that no shard sits
    straight behind another (the plain isometric view hides the octant behind the centre).
    """
    n = 96
    i = np.arange(n) + 0.5
    z = 0.25 + 0.3 * i / n  # elevation between ~15 and ~33 degrees: a natural oblique view
    phi = i * np.pi * (3 - np.sqrt(5))
    r = np.sqrt(1 - z**2)
    cands = np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)
    if len(anchors) < 2:
        return np.array([1.0, 1.0, 1.0]) / np.sqrt(3)
    best, best_score = cands[0], -1.0
    a = anchors - anchors.mean(axis=0)
    for d in cands:
        u = np.cross(d, [0.0, 0.0, 1.0])
        u /= np.linalg.norm(u)
        v = np.cross(u, d)
        xy = a @ np.stack([u, v], axis=1)
        gaps = np.linalg.norm(xy[:, None] - xy[None], axis=-1)
        np.fill_diagonal(gaps, np.inf)
        score = float(gaps.min())
        if score > best_score + 1e-9:
            best, best_score = d, score
    return best


def _side_direction(centres: np.ndarray) -> np.ndarray:
    """A three-quarter view of a surface from above: mostly across its longer horizontal axis
    (a car is seen from the side, not end-on), a little along it, ~25 degrees up."""
    ext = np.ptp(centres, axis=0)
    long_axis = 0 if ext[0] >= ext[1] else 1
    d = np.zeros(3)
    d[long_axis] = 0.5
    d[1 - long_axis] = 0.8
    d[2] = 0.45
    return d / np.linalg.norm(d)


def _flat(centres: np.ndarray) -> bool:
    span = np.ptp(centres, axis=0) if len(centres) else np.zeros(3)
    return bool(span[2] <= 1e-9 * max(float(span.max()), 1e-300))


def render_views(
    partition: Partition,
    *,
    mesh: Any = None,
    points: Any = None,
    on: str = "cells",
    solid: bool | None = None,
    size: int | tuple[int, int] = _VIEW_PX,
    normals: Any = None,
    areas: Any = None,
) -> tuple[list[np.ndarray], list[str]]:
    """The 3-D views of :func:`render_png` as RGB images, and their captions.

    ``solid`` (default: a mesh with 3-D cells, or a 3-D point cloud) selects the exploded and
    cut-open views; otherwise a surface is seen from two opposite sides. ``normals`` and
    ``areas`` (one per row of ``points``) draw the points of a surface as small oriented
    patches (:func:`_surfels`), an opaque surface, instead of dots.

    Returns
    -------
    images : list of uint8 arrays of shape (size, size, 3); one wide image for flat data
    captions : list of str
    """
    import pyvista as pv

    P = partition.nparts
    colours = [_hex(c) for c in shard_palette(P)]
    kind, data, centres, shard = _scene(partition, mesh, points, on)

    if partition.num_points == 0:
        return [np.full((size, size, 3), 255, np.uint8)] * 2, ["(no rows)", "(no rows)"]
    centre = centres.mean(axis=0)
    span = float(np.ptp(centres, axis=0).max()) or 1.0
    cent = _part_centroids(centres, partition.assignment, P)
    flat = _flat(centres)
    if solid is None:
        solid = _is_volume(mesh) if mesh is not None else True  # a bare cloud may be a volume
    volume = bool(solid) and not flat
    patches = None
    if kind == "points" and normals is not None and areas is not None and not volume:
        rows = _sample_rows(len(centres))
        patches = (np.asarray(normals)[rows], np.asarray(areas)[rows])
    row_centres = centres if kind == "cells" else data
    live = np.flatnonzero(partition.sizes > 0)
    if volume:
        # exploded: move each shard outwards
        shift = _EXPLODE * (cent - centre)
        d = _view_direction((cent + shift)[live])
        # cut open: drop the half facing the camera, through the centre of the cells (where
        # a graded volume is densest, so the small inner shards cross the cut); an octant
        # left the inner shards of a dome-shaped volume hidden behind the outer ones
        near = (row_centres - centre) @ d > 0
        views = [("exploded", shift, None, d), ("cut open", None, ~near, d)]
    elif flat:
        views = [("from above", None, None, None)]
        size = (2 * size + 10, size)
    else:
        d = _side_direction(centres)
        back = np.array([-d[0], -d[1], d[2]])
        views = [("front", None, None, d), ("back", None, None, back)]
    images, captions = [], []
    window = list(size) if isinstance(size, tuple) else [size, size]
    scene = (kind, data, shard, P, colours, patches, centre, span, window, volume)
    with capture_vtk_output() as vtk_log:
        for caption, shift, keep, direction in views:
            images.append(_render_view(pv, scene, shift, keep, direction))
            captions.append(caption)
        if volume and len(live) > 1:
            _best_views(pv, scene, images, captions, row_centres, live, views[1][3])
    if vtk_log.messages():
        log.debug("VTK while rendering: %s", vtk_log.summary(limit=5))
    return images, captions


def _render_view(pv: Any, scene: tuple, shift: Any, keep: Any, direction: Any) -> np.ndarray:
    """One off-screen view of the shards (cells as surfaces, patches or points)."""
    kind, data, shard, P, colours, patches, centre, span, window, volume = scene
    pl = pv.Plotter(off_screen=True, window_size=window)
    pl.background_color = "white"
    for p in range(P):
        sel = shard == p
        if keep is not None:
            sel &= keep
        ids = np.flatnonzero(sel)
        if ids.size == 0:
            continue
        if kind == "cells":
            piece = _surface(data.extract_cells(ids))
            if shift is not None:
                piece.points = np.asarray(piece.points) + shift[p]
            pl.add_mesh(piece, color=colours[p], ambient=0.55, diffuse=0.5,
                        specular=0.0, smooth_shading=False)  # fmt: skip
        elif patches is not None:
            piece = _surfels(data[ids], patches[0][ids], patches[1][ids])
            pl.add_mesh(piece, color=colours[p], ambient=0.55, diffuse=0.5,
                        specular=0.0)  # fmt: skip
        else:
            xyz = data[ids] + (shift[p] if shift is not None else 0.0)
            px = 7 if len(data) < 2e4 else 5 if len(data) < 2e5 else 2
            pl.add_points(xyz, color=colours[p], point_size=px,
                          render_points_as_spheres=len(data) < 2e5, ambient=0.55,
                          diffuse=0.5)  # fmt: skip
    if direction is None:
        pl.view_xy()
    else:
        d = np.asarray(direction, dtype=np.float64)
        pl.camera.focal_point = centre
        pl.camera.position = centre + 3 * span * d / np.linalg.norm(d)
        pl.camera.up = (0, 0, 1)
    pl.reset_camera()
    pl.camera.zoom(1.0 if volume else 1.1)
    img = np.asarray(pl.screenshot(return_img=True))[..., :3]
    pl.close()
    return img


#: a shard counts as shown when at least this many pixels have its colour
_MIN_SHOWN_PX = 20


def shown_shards(image: np.ndarray, parts: int) -> np.ndarray:
    """Pixels of each shard's colour (under any lighting factor in [0.5, 1.05]) in a view."""
    px = np.asarray(image, dtype=np.float64).reshape(-1, 3)
    counts = np.zeros(parts, dtype=np.int64)
    for p, c in enumerate(shard_palette(parts).astype(np.float64)):
        k = px @ c / (c @ c)
        resid = np.abs(px - k[:, None] * c).max(axis=1)
        counts[p] = int(((k >= 0.5) & (k <= 1.05) & (resid <= 10)).sum())
    return counts


def _best_views(pv: Any, scene: tuple, images: list, captions: list,
                row_centres: np.ndarray, live: np.ndarray, d: np.ndarray) -> None:
    """Replace the two volume views (in place) by the pair that shows the most shards.

    The first cut goes through the centre of the cells (where a graded volume is densest, so
    small inner shards cross it). When a shard still shows in neither view, a cut just in front
    of it is tried too (for up to four hidden shards): the whole shard stays and all that stood
    in front of it is cut away (a thin boundary-layer shard shows its face, where a cut through
    its middle shows only a thin ring). Of all pairs of views, the one showing the most shards
    is kept; the exploded and centre-cut pair wins ties."""
    P, shard = scene[3], scene[2]
    cands = [(c, img, shown_shards(img, P) >= _MIN_SHOWN_PX) for c, img in zip(captions, images)]
    hidden = [p for p in live if not (cands[0][2][p] or cands[1][2][p])]
    if not hidden:
        return
    depth = row_centres @ d
    for p in hidden[:4]:
        front = float(depth[shard == p].max())
        img = _render_view(pv, scene, None, depth <= front + 1e-9 * (abs(front) + 1.0), d)
        cands.append((f"cut in front of shard {p}", img, shown_shards(img, P) >= _MIN_SHOWN_PX))
    best, best_n = (0, 1), -1
    for i in range(len(cands)):
        for j in range(i + 1, len(cands)):
            n = int((cands[i][2] | cands[j][2])[live].sum())
            if n > best_n:
                best, best_n = (i, j), n
    images[:] = [cands[k][1] for k in best]
    captions[:] = [cands[k][0] for k in best]
    if best_n < len(live):
        log.debug("render: %d of %d shards show in neither view", len(live) - best_n, len(live))


def _title(partition: Partition, rep: dict | None) -> str:
    rep = rep or {}
    parts = [f"{partition.method}", f"P = {partition.nparts}"]
    if "imbalance" in rep:
        parts.append(f"imbalance {rep['imbalance']:.3f}")
    else:
        sizes = partition.sizes
        parts.append(f"imbalance {sizes.max() * sizes.size / max(sizes.sum(), 1):.3f}")
    if "edge_cut_fraction" in rep:
        parts.append(f"edge cut {int(rep['edge_cut']):,} ({100 * rep['edge_cut_fraction']:.2f}%)")
    elif "edge_cut" in rep:
        parts.append(f"edge cut {int(rep['edge_cut']):,}")
    else:
        parts.append(f"edge cut {rep.get('graph_metrics') or 'not computed'}")
    return "   ·   ".join(parts)


def render_png(
    partition: Partition,
    path: str | Path,
    *,
    mesh: Any = None,
    points: Any = None,
    on: str = "cells",
    report: dict | None = None,
    title: str | None = None,
    solid: bool | None = None,
    normals: Any = None,
    areas: Any = None,
) -> Path:
    """Render the shards (two 3-D views), a per-part size chart and a title to a PNG.

    Parameters
    ----------
    partition : Partition
        Over the mesh's cells (``on="cells"``), its points (``on="points"``), or ``points``.
    path : str or Path
        Output PNG (its directory is created).
    mesh : pyvista.DataSet, optional
    points : array of shape (N, 3) or (N, 2), optional
        Used when ``mesh`` is None (or to draw huge meshes as points).
    on : {"cells", "points"}
    report : dict, optional
        A :func:`meshshard.partition.report.report` dict: imbalance and edge cut for the title.
    title : str, optional
        First title line (default: the source in ``report``, else "meshshard partition").
    solid : bool, optional
        Draw exploded and cut open (default for volume meshes and bare 3-D point clouds)
        rather than from two sides (default for surfaces); pass False for points sampled on
        a surface.
    normals, areas : arrays of shape (N, 3) and (N,), optional
        With ``points`` on a surface (``solid=False``): draw each point as a patch of that
        orientation and area, so the surface is opaque.

    Returns
    -------
    Path

    Examples
    --------
    >>> import numpy as np, tempfile, pathlib
    >>> from meshshard.partition import partition
    >>> pts = np.random.default_rng(0).random((500, 3))
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "shards.png"
    >>> render_png(partition(pts, 4), out, points=pts).is_file()
    True
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    path = Path(path)
    images, captions = render_views(partition, mesh=mesh, points=points, on=on, solid=solid,
                                    normals=normals, areas=areas)  # fmt: skip
    P = partition.nparts
    colours = shard_palette(P) / 255.0
    dpi = 100
    W, H = FIGSIZE_PX
    fig = Figure(figsize=(W / dpi, H / dpi), dpi=dpi, facecolor="white")
    boxes = VIEW_BOXES if len(images) > 1 else [(*VIEW_BOXES[0][:2], *VIEW_BOXES[1][2:])]
    for (x0, y0, x1, y1), img, cap in zip(boxes, images, captions):
        ax = fig.add_axes((x0 / W, 1 - y1 / H, (x1 - x0) / W, (y1 - y0) / H))
        ax.imshow(img, interpolation="nearest")
        ax.set_axis_off()
        fig.text((x0 + x1) / 2 / W, 1 - (y0 - 4) / H, cap, ha="center", va="bottom",
                 fontsize=13, color="0.3")  # fmt: skip
    # per-part sizes against the targets
    rep = report or {}
    sizes = partition.sizes
    targets = np.asarray(rep.get("targets") or np.full(P, 1.0 / P)) * sizes.sum()
    ax = fig.add_axes((1380 / W, 330 / H, 390 / W, 330 / H))
    ax.bar(np.arange(P), sizes, color=colours, edgecolor="0.25", linewidth=0.4, width=0.8)
    ax.step(np.arange(P + 1) - 0.5, np.r_[targets, targets[-1]], where="post", color="black",
            linestyle="--", linewidth=1, label="target")  # fmt: skip
    ax.set_xlabel("shard")
    ax.set_ylabel("rows" if "num_points" not in rep else f"rows (of {rep['num_points']:,})")
    ax.set_title("shard sizes (dashed: target)", fontsize=12)
    ax.set_xlim(-0.6, P - 0.4)
    if P <= 20:
        ax.set_xticks(np.arange(P))
    ax.spines[["top", "right"]].set_visible(False)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    total = max(int(sizes.sum()), 1)
    if P <= 16:  # a legend of sizes; beyond that the bars are the legend
        labels = [f"{p}: {int(sizes[p]):,} ({100 * sizes[p] / total:.1f}%)" for p in range(P)]
        handles = [Patch(facecolor=colours[p], label=labels[p]) for p in range(P)]
        ax.legend(handles=handles, fontsize=9, ncol=1 if P <= 4 else 2, frameon=False,
                  loc="upper left", bbox_to_anchor=(-0.02, -0.17), title="rows per shard",
                  title_fontsize=9, alignment="left")  # fmt: skip
    head = title or (f"{rep['source']}" if rep.get("source") else "meshshard partition")
    fig.text(0.5, 0.975, _title(partition, rep), ha="center", va="top", fontsize=18,
             weight="bold")  # fmt: skip
    fig.text(0.5, 0.92, head, ha="center", va="top", fontsize=11, color="0.35")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, facecolor="white")
    return path
