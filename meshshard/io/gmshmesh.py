"""An unstructured tetrahedral volume around a car-like body, meshed with gmsh (extra: ``mesh``).

The generated DrivaerML-like meshes (:mod:`meshshard.datasets.synthetic`) are structured
grids bent around a body: a space-filling curve already cuts them almost optimally, so they
cannot show what a graph partitioner buys on a real CFD mesh. This module meshes a wind-tunnel
box minus a car-like body (an ellipsoid body, a cabin, four wheels) with gmsh's Delaunay
mesher, graded from ``h`` at the body to ``4 h`` three metres away: cells of every shape and
orientation, dense near the wall, like a production volume mesh.

gmsh is imported inside :func:`tet_volume`, so ``import meshshard`` never needs it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

__all__ = ["tet_volume"]

log = logging.getLogger(__name__)

_TOL = 1e-5  # OCC pads bounding boxes by ~1e-7: a flat face's box is not exactly flat
_VERSION = 2  # bump when the geometry or the sizing changes: cached meshes are keyed by it
_TUNNEL = ((-4.0, -3.0, 0.0), (12.0, 6.0, 4.0))  # corner, extent (metres)
_TETS_PER_H3 = 2.5  # tets per unit volume at size h, times h^3 (a first guess, refined below)


def _build_geometry(gmsh) -> list[tuple[int, int]]:
    """Tunnel box minus the body; returns the body's boundary surfaces (dim, tag): every
    surface of the fluid volume but the six tunnel walls."""
    occ = gmsh.model.occ
    body = occ.addSphere(0.0, 0.0, 0.0, 1.0)
    occ.dilate([(3, body)], 0.0, 0.0, 0.0, 2.3, 0.95, 0.55)
    occ.translate([(3, body)], 0.0, 0.0, 0.85)
    cabin = occ.addSphere(0.0, 0.0, 0.0, 1.0)
    occ.dilate([(3, cabin)], 0.0, 0.0, 0.0, 1.2, 0.75, 0.45)
    occ.translate([(3, cabin)], 0.3, 0.0, 1.2)
    wheels = [
        occ.addCylinder(x, y - 0.12, 0.45, 0.0, 0.24, 0.0, 0.33)
        for x in (-1.45, 1.45)
        for y in (-0.8, 0.8)
    ]
    car, _ = occ.fuse([(3, body)], [(3, cabin)] + [(3, w) for w in wheels])
    tunnel = occ.addBox(*_TUNNEL[0], *_TUNNEL[1])
    occ.cut([(3, tunnel)], car)
    occ.synchronize()
    (volume,) = gmsh.model.getEntities(3)
    outer = gmsh.model.getBoundary([volume], oriented=False)
    x0, y0, z0 = _TUNNEL[0]
    x1, y1, z1 = (a + b for a, b in zip(_TUNNEL[0], _TUNNEL[1]))
    car_surfaces = []
    for dim, tag in outer:
        bb = gmsh.model.getBoundingBox(dim, tag)
        on_wall = any(
            abs(bb[i] - bb[i + 3]) < _TOL and min(abs(bb[i] - lo), abs(bb[i] - hi)) < _TOL
            for i, (lo, hi) in enumerate(((x0, x1), (y0, y1), (z0, z1)))
        )
        if not on_wall:
            car_surfaces.append((dim, tag))
    if len(outer) - len(car_surfaces) != 6:
        found = len(outer) - len(car_surfaces)
        msg = f"expected 6 tunnel walls among {len(outer)} surfaces, found {found}"
        raise RuntimeError(msg)
    return car_surfaces


def _mesh(h: float) -> tuple[np.ndarray, np.ndarray]:
    import gmsh

    gmsh.initialize(interruptible=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.option.setNumber("General.NumThreads", 1)
        gmsh.model.add("tunnel")
        body_surfaces = _build_geometry(gmsh)
        field = gmsh.model.mesh.field
        dist = field.add("Distance")
        field.setNumbers(dist, "SurfacesList", [t for _, t in body_surfaces])
        field.setNumber(dist, "Sampling", 40)
        thr = field.add("Threshold")
        field.setNumber(thr, "InField", dist)
        field.setNumber(thr, "SizeMin", h)
        field.setNumber(thr, "SizeMax", 4 * h)
        field.setNumber(thr, "DistMin", 0.05)
        field.setNumber(thr, "DistMax", 3.0)
        field.setAsBackgroundMesh(thr)
        for opt, val in (("MeshSizeFromPoints", 0), ("MeshSizeFromCurvature", 0),
                         ("MeshSizeExtendFromBoundary", 0), ("Algorithm", 6),
                         ("Algorithm3D", 1), ("RandomSeed", 1)):  # fmt: skip
            gmsh.option.setNumber(f"Mesh.{opt}", val)
        gmsh.model.mesh.generate(3)
        node_tags, coords, _ = gmsh.model.mesh.getNodes()
        _, elem_nodes = gmsh.model.mesh.getElementsByType(4)  # 4: 4-node tetrahedron
    finally:
        gmsh.finalize()
    tets = np.asarray(elem_nodes, dtype=np.int64).reshape(-1, 4)
    lookup = np.full(int(node_tags.max()) + 1, -1, dtype=np.int64)
    lookup[np.asarray(node_tags, dtype=np.int64)] = np.arange(len(node_tags))
    points = np.asarray(coords, dtype=np.float64).reshape(-1, 3)
    tets = lookup[tets]
    used = np.unique(tets)  # drop nodes that belong to no tetrahedron
    remap = np.full(len(points), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return points[used], remap[tets]


def tet_volume(
    cells: int, *, cache_dir: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Tetrahedral volume mesh of a wind tunnel around a car-like body, about ``cells`` tets.

    The mesh size is calibrated on a coarse mesh (1.6 times the size, ~1/4 of the cells),
    then the full mesh is built: the count is within ~25% of ``cells`` (below it on small
    meshes, where it grows more slowly than ``h^-2.85``; 1,072,431 for ``cells=10**6``).
    gmsh runs on one thread; ~1M tets take two to three minutes.

    Parameters
    ----------
    cells : int
        Target number of tetrahedra (>= 1000).
    cache_dir : path, optional
        Directory where the mesh is kept as ``.npy`` (keyed by ``cells`` and a geometry
        version); a later call with the same arguments loads it instead of meshing.

    Returns
    -------
    points : ndarray of shape (n_points, 3), float64
    tets : ndarray of shape (n_tets, 4), int64
        VTK_TETRA vertex order (gmsh's), positively oriented.

    Raises
    ------
    ImportError
        gmsh is not installed (``pip install -e '.[mesh]'``).
    ValueError
        ``cells`` < 1000.

    Examples
    --------
    >>> points, tets = tet_volume(20_000)  # doctest: +SKIP
    >>> dual_graph(cells=tets, celltypes=10)  # doctest: +SKIP
    """
    if cells < 1000:
        msg = f"cells={cells} is too small for the tunnel geometry; use >= 1000"
        raise ValueError(msg)
    try:
        import gmsh  # noqa: F401
    except ImportError as exc:
        msg = "tet_volume needs gmsh: pip install -e '.[mesh]' (or pip install gmsh)"
        raise ImportError(msg) from exc
    paths = None
    if cache_dir is not None:
        stem = Path(cache_dir) / f"gmsh_tunnel_v{_VERSION}_{int(cells)}"
        paths = (stem.with_name(stem.name + "_points.npy"), stem.with_name(stem.name + "_tets.npy"))
        if all(p.exists() for p in paths):
            log.info("loading the cached mesh %s", stem)
            return np.load(paths[0]), np.load(paths[1])
    volume = float(np.prod(_TUNNEL[1]))
    h = (_TETS_PER_H3 * volume / cells) ** (1 / 3)
    if cells >= 2000:  # calibrate on a mesh with ~1/4 of the cells: count ~ h^-a with a < 3,
        # as the graded far field is capped at 4 h (a grows with the count; 2.85 fits ~1M)
        hc = 1.6 * h
        h = hc * (len(_mesh(hc)[1]) / cells) ** (1 / 2.85)
    points, tets = _mesh(h)
    log.info("gmsh: %d tets, %d points at h=%.4f", len(tets), len(points), h)
    if paths is not None:
        paths[0].parent.mkdir(parents=True, exist_ok=True)
        for path, arr in zip(paths, (points, tets)):
            tmp = path.with_name(path.name + f".tmp{os.getpid()}.npy")
            np.save(tmp, arr)
            os.replace(tmp, path)  # atomic: a reader never sees half a file
    return points, tets
