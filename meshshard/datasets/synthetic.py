"""A synthetic DrivaerML-like run: real ``.vtp``/``.vtu``/``.stl`` files with DrivaerML's layout.

The body is a closed, car-like deformed superellipsoid (boxy cross-section, a cabin bump on the
roof, a flat underbody, four wheel bumps) meshed with quads and a ring of triangles at each end.
Fields are plausible rather than solutions of anything:

- the surface file in OpenFOAM's conventions, like DrivaerML's: faces wound with their
  normals into the body, wall shear stress the stress on the fluid;
- surface pressure from a potential-flow-like formula, ``Cp = 1 - 2.25 (1 - n_x^2)``
  (stagnation ``Cp = 1`` at the front, suction on the roof), blended to a base pressure in the
  wake; wall shear stress along the surface-projected free stream (tangential by construction);
- a volume of hexahedra (wedges at the two ends) extruded from a coarser body mesh along the
  vertex normals with geometric grading, so cells crowd into a boundary layer; velocity with a
  no-slip wall damping, Bernoulli pressure, and an eddy viscosity that peaks near the wall.

Everything is vectorised numpy; pyvista writes the files. Sizes up to DrivaerML's (~8.8M surface
cells) take seconds to tens of seconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshshard.datasets.schema import DRIVAERML, DatasetSchema
from meshshard.io.geometry import cell_centres, polygon_geometry, polygon_normals_areas

__all__ = ["SyntheticRun", "car_body", "make_synthetic_run"]

log = logging.getLogger(__name__)

_LENGTH, _WIDTH, _HEIGHT = 4.6, 1.9, 1.45  # metres, a mid-size car


@dataclass(frozen=True)
class SyntheticRun:
    """Paths of a generated run and its cell counts."""

    run_dir: Path
    surface: Path
    volume: Path | None
    stl: Path | None
    surface_cells: int
    volume_cells: int
    stl_cells: int


def _grid_size(cells: int) -> tuple[int, int]:
    """Rings ``nu`` and segments ``nv`` with ``(nu + 1) * nv`` close to ``cells``."""
    nv = max(8, 2 * round(np.sqrt(cells) / 2))
    nu = max(2, round(cells / nv) - 1)
    return nu, nv


def car_body(cells: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Closed car-like surface with about ``cells`` cells, outward-oriented.

    Returns
    -------
    points : ndarray of shape (nu * nv + 2, 3), float64
    offsets : ndarray of shape (n_cells + 1,), int64
    conn : ndarray of shape (offsets[-1],), int64
        ``n_cells = (nu + 1) * nv``: ``(nu - 1) * nv`` quads then ``2 * nv`` triangles.
    """
    if cells < 16:
        msg = f"cells={cells} is too small for a closed body; use >= 16"
        raise ValueError(msg)
    nu, nv = _grid_size(cells)
    u = np.pi * (np.arange(nu) + 1) / (nu + 1)
    v = 2 * np.pi * np.arange(nv) / nv
    uu, vv = np.meshgrid(u, v, indexing="ij")
    e1, e2 = 0.45, 0.35

    def spow(x: np.ndarray, e: float) -> np.ndarray:
        return np.sign(x) * np.abs(x) ** e

    a, b, c = _LENGTH / 2, _WIDTH / 2, _HEIGHT / 2
    xn = -spow(np.cos(uu), e1)  # front (u=0) at x=-a: the flow comes from -x
    r = np.abs(np.sin(uu)) ** e1
    y = b * r * spow(np.cos(vv), e2)
    zr = r * spow(np.sin(vv), e2)
    cabin = 0.55 + 0.45 * np.exp(-(((xn - 0.1) / 0.5) ** 2))
    z = np.where(zr > 0, c * 1.3 * zr * cabin, c * 0.55 * zr)
    x = a * xn
    for xw in (-0.6 * a, 0.62 * a):  # wheels: rounded bumps below the sills
        for yw in (-0.72 * b, 0.72 * b):
            z -= 0.22 * np.exp(-(((x - xw) / 0.38) ** 2 + ((y - yw) / 0.25) ** 2)) * (zr < 0)
    ring = np.stack([x, y, z], axis=-1).reshape(-1, 3)
    front = np.array([[-a, 0.0, 0.0]])
    back = np.array([[a, 0.0, 0.0]])
    points = np.concatenate([ring, front, back])
    points[:, 2] -= points[:, 2].min() - 0.12  # 12 cm ground clearance
    f_id, b_id = nu * nv, nu * nv + 1

    i, j = np.meshgrid(np.arange(nu - 1), np.arange(nv), indexing="ij")
    j1 = (j + 1) % nv
    quads = np.stack([i * nv + j, i * nv + j1, (i + 1) * nv + j1, (i + 1) * nv + j], -1)
    jj = np.arange(nv)
    tri_f = np.stack([np.full(nv, f_id), (jj + 1) % nv, jj], -1)
    last = (nu - 1) * nv
    tri_b = np.stack([np.full(nv, b_id), last + jj, last + (jj + 1) % nv], -1)
    conn = np.concatenate([quads.reshape(-1), tri_f.reshape(-1), tri_b.reshape(-1)])
    nq, nt = quads.shape[0] * quads.shape[1], 2 * nv
    offsets = np.concatenate([np.arange(nq + 1) * 4, nq * 4 + np.arange(1, nt + 1) * 3])
    conn = conn.astype(np.int64)
    # orient outward: a positive enclosed volume (divergence theorem on the cells)
    normals, areas = polygon_normals_areas(points, offsets, conn)
    centres = cell_centres(points, offsets, conn)
    if float(np.sum(np.sum(normals * centres, axis=1) * areas)) < 0:
        conn = _flip(offsets, conn)
    return points, offsets.astype(np.int64), conn


def _flip(offsets: np.ndarray, conn: np.ndarray) -> np.ndarray:
    out = conn.copy()
    count = np.diff(offsets)
    for k in np.unique(count):
        sel = np.flatnonzero(count == k)
        idx = offsets[sel][:, None] + np.arange(k)
        out[idx] = conn[idx[:, ::-1]]
    return out


def _surface_fields(
    normals: np.ndarray, centres: np.ndarray, u_inf: float, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    nx, nz = normals[:, 0], normals[:, 2]
    t = np.zeros_like(normals)
    t[:, 0] = 1.0
    t -= nx[:, None] * normals  # free stream projected on the surface
    tt = np.einsum("ij,ij->i", t, t)
    cp = 1.0 - 2.25 * tt
    wake = 1.0 / (1.0 + np.exp(-(nx - 0.1) / 0.08))
    cp = (1.0 - wake) * cp + wake * (-0.22 + 0.05 * np.sin(4 * centres[:, 2]))
    cp = np.where(nz < -0.5, 0.6 * cp, cp)  # underbody: weaker suction
    cp += rng.normal(0.0, 0.01, cp.shape)
    q = 0.5 * u_inf**2  # kinematic dynamic pressure (DrivaerML stores p / rho)
    cf = 0.0035 * (0.6 + np.sqrt(tt)) * (1.0 - 0.5 * wake)
    wss = (cf * q)[:, None] * t
    return {
        "pMeanTrim": (q * cp).astype(np.float32),
        "wallShearStressMeanTrim": wss.astype(np.float32),
        "CpMeanTrim": cp.astype(np.float32),
    }


def _point_normals(points, offsets, conn, normals, areas) -> np.ndarray:
    count = np.diff(offsets)
    owner = np.repeat(np.arange(count.size), count)
    w = (normals * areas[:, None])[owner]
    pn = np.stack([np.bincount(conn, w[:, d], minlength=len(points)) for d in range(3)], -1)
    return pn / np.maximum(np.linalg.norm(pn, axis=1, keepdims=True), 1e-30)


def _volume(cells: int, u_inf: float, rng: np.random.Generator):
    layers = int(max(3, min(40, round(cells ** (1 / 3) / 1.2))))
    base = max(16, cells // layers)
    points, offsets, conn = car_body(base)
    normals, areas = polygon_normals_areas(points, offsets, conn)
    pn = _point_normals(points, offsets, conn, normals, areas)
    growth, outer = 1.25, 4.0
    d = outer * (growth ** np.arange(layers + 1) - 1) / (growth**layers - 1)
    npts = len(points)
    vpoints = (points[None] + d[:, None, None] * pn[None]).reshape(-1, 3)
    count = np.diff(offsets)
    quads = conn[offsets[:-1][count == 4][:, None] + np.arange(4)]
    tris = conn[offsets[:-1][count == 3][:, None] + np.arange(3)]
    k = np.arange(layers)[:, None, None] * npts
    hexes = np.concatenate([quads[None] + k, quads[None] + k + npts], -1).reshape(-1, 8)
    wedges = np.concatenate([tris[None] + k, tris[None] + k + npts], -1).reshape(-1, 6)
    # per cell: wall normal of its base face and distance of its centre from the wall
    fn = np.concatenate(
        [np.tile(normals[count == 4], (layers, 1)), np.tile(normals[count == 3], (layers, 1))]
    )
    dm = 0.5 * (d[:-1] + d[1:])
    dist = np.concatenate(
        [np.repeat(dm, int((count == 4).sum())), np.repeat(dm, int((count == 3).sum()))]
    )
    nx = fn[:, 0]
    t = np.zeros_like(fn)
    t[:, 0] = 1.0
    t -= nx[:, None] * fn
    w = np.exp(-dist / 1.0)[:, None]
    ex = np.array([1.0, 0.0, 0.0])
    u_inv = u_inf * ((1 - w) * ex + 1.5 * w * t)
    rear = (1.0 / (1.0 + np.exp(-(nx - 0.1) / 0.08)))[:, None]
    u_inv *= 1.0 - 0.6 * rear * np.exp(-dist / 1.5)[:, None]
    delta = float(np.clip(2.0 * d[1], 0.005, 0.1))  # boundary layer: about two wall cells
    u = u_inv * (1.0 - np.exp(-dist / delta))[:, None]
    p = 0.5 * (u_inf**2 - np.einsum("ij,ij->i", u_inv, u_inv))
    nut = 0.41 * 0.05 * u_inf * dist * np.exp(-dist / 0.5) + 1e-5
    u += rng.normal(0.0, 0.005 * u_inf, u.shape)
    fields = {
        "UMeanTrim": u.astype(np.float32),
        "pMeanTrim": p.astype(np.float32),
        "nutMeanTrim": nut.astype(np.float32),
        "CpMeanTrim": (p / (0.5 * u_inf**2)).astype(np.float32),  # extra array, like DrivaerML
    }
    return vpoints, hexes, wedges, fields


def _polydata(points: np.ndarray, offsets: np.ndarray, conn: np.ndarray):
    import pyvista as pv

    mesh = pv.PolyData()
    mesh.points = points.astype(np.float32)
    mesh.SetPolys(pv.CellArray.from_arrays(offsets, conn))
    return mesh


def make_synthetic_run(
    dst: str | Path,
    index: int = 1,
    surface_cells: int = 200_000,
    volume_cells: int | None = None,
    seed: int = 0,
    *,
    stl_cells: int | None = None,
    schema: DatasetSchema = DRIVAERML,
) -> SyntheticRun:
    """Write ``dst/run_<index>/{boundary,volume,drivaer}_<index>.{vtp,vtu,stl}``.

    Parameters
    ----------
    dst : path
        Parent directory (created); the run goes to ``dst/run_<index>``.
    index : int
        Run number used in the directory and file names.
    surface_cells : int
        About this many surface cells (quads, plus ``2 * nv`` triangles at the ends).
    volume_cells : int, optional
        About this many volume cells; ``None`` means ``surface_cells``, ``0`` writes no volume.
    seed : int
        Seeds the small noise on the fields; same seed, same files' arrays.
    stl_cells : int, optional
        Size of the (triangulated) STL; default ``min(surface_cells, 50_000)``; 0 writes none.
    schema : DatasetSchema
        File names, and ``u_inf`` for the field magnitudes.

    Returns
    -------
    SyntheticRun

    Examples
    --------
    >>> run = make_synthetic_run("/tmp/data", index=1, surface_cells=2000)  # doctest: +SKIP
    >>> run.surface.name
    'boundary_1.vtp'
    """
    import pyvista as pv

    rng = np.random.default_rng(seed)
    run_dir = Path(dst) / f"{schema.run_prefix}{index}"
    run_dir.mkdir(parents=True, exist_ok=True)
    u_inf = schema.u_inf

    points, offsets, conn = car_body(surface_cells)
    centres, normals, _ = polygon_geometry(points, offsets, conn)
    fields = _surface_fields(normals, centres, u_inf, rng)
    # the solver's conventions (OpenFOAM, DrivaerML): faces wound so that their normals point
    # into the body, and the wall shear is the stress on the fluid
    surf = _polydata(points, offsets, _flip(offsets, conn))
    fields["wallShearStressMeanTrim"] = np.negative(fields["wallShearStressMeanTrim"])
    for name, arr in fields.items():
        surf.cell_data[name] = arr
    del normals, centres
    surface_path = run_dir / schema.surface_file.format(i=index)
    surf.save(surface_path)
    n_surface = surf.n_cells
    del surf

    volume_path = None
    n_volume = 0
    vcells = surface_cells if volume_cells is None else volume_cells
    if vcells:
        vpoints, hexes, wedges, vfields = _volume(vcells, u_inf, rng)
        grid = pv.UnstructuredGrid(
            {pv.CellType.HEXAHEDRON: hexes, pv.CellType.WEDGE: wedges},
            vpoints.astype(np.float32),
        )
        for name, arr in vfields.items():
            grid.cell_data[name] = arr
        volume_path = run_dir / schema.volume_file.format(i=index)
        grid.save(volume_path)
        n_volume = grid.n_cells
        del grid, vpoints, hexes, wedges, vfields

    stl_path = None
    n_stl = 0
    scells = min(surface_cells, 50_000) if stl_cells is None else stl_cells
    if scells:
        sp, so, sc = car_body(max(16, scells // 2))
        body = _polydata(sp, so, sc).triangulate()
        stl_path = run_dir / schema.stl_file.format(i=index)
        body.save(stl_path)
        n_stl = body.n_cells
    log.info("synthetic run %s: %d surface, %d volume cells", run_dir, n_surface, n_volume)
    return SyntheticRun(run_dir, surface_path, volume_path, stl_path, n_surface, n_volume, n_stl)
