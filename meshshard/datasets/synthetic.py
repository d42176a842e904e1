"""A synthetic DrivaerML-like run: real ``.vtp``/``.vtu``/``.stl`` files with DrivaerML's layout.

The body is a closed, car-like deformed superellipsoid (boxy cross-section, a cabin bump on the
roof, a flat underbody, four wheel bumps) meshed with quads and a ring of triangles at each end.
Its shape is set by a :class:`Morph` (length, width, height, ride height, nose and tail
bluntness, boat-tail taper, cabin height), as DrivaerML morphs one car into hundreds:
:func:`generate_runs` draws one per run and writes it beside the run as
``geo_parameters_<i>.csv``. Fields are plausible rather than solutions of anything, but they
are computed from the shape (its normals, its ride height), so drag and lift change with it:

- the surface file in OpenFOAM's conventions, like DrivaerML's: faces wound with their
  normals into the body, wall shear stress the stress on the fluid;
- surface pressure from a potential-flow-like formula, ``Cp = 1 - 2.25 (1 - n_x^2)^3``
  (stagnation ``Cp = 1`` at the front, suction peaking where the surface turns parallel to the
  flow, on the roof), blended to a base pressure in the wake, with more suction under a lower
  car; wall shear stress along the surface-projected free stream (tangential by construction).
  Drag grows with a blunter nose or tail, a taller body and a higher ride height, and falls
  with length (C_d about 0.1-0.45 over :data:`MORPH_RANGES`, 0.15 for the baseline car);
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

__all__ = ["MORPH_RANGES", "Morph", "SyntheticRun", "car_body", "generate_runs",
           "make_synthetic_run", "read_morph"]

log = logging.getLogger(__name__)

_LENGTH, _WIDTH, _HEIGHT = 4.6, 1.9, 1.45  # metres, a mid-size car
_RIDE = 0.12  # ground clearance of the baseline car, m

#: the range :meth:`Morph.sample` draws each parameter from (uniformly)
MORPH_RANGES: dict[str, tuple[float, float]] = {
    "length": (0.88, 1.12),
    "width": (0.92, 1.08),
    "height": (0.9, 1.1),
    "ride_height": (0.08, 0.18),
    "nose": (0.25, 0.5),
    "tail": (0.2, 0.6),
    "boat_tail": (0.0, 0.3),
    "cabin": (0.3, 0.55),
}


@dataclass(frozen=True)
class Morph:
    """The shape of a synthetic car; the defaults are the baseline car.

    Parameters
    ----------
    length, width, height : float
        Scales of the baseline's 4.6 x 1.9 x 1.45 m.
    ride_height : float
        Ground clearance, m (the underbody's suction grows as it shrinks).
    nose, tail : float
        Exponents of the front and rear halves of the side profile: small is blunt (a box),
        large is round and slender (a bullet nose, a fastback).
    boat_tail : float
        Fraction by which the cross-section tapers over the rearmost 35 % of the length.
    cabin : float
        Height of the cabin bump on the roof (fraction of the roof's height).
    """

    length: float = 1.0
    width: float = 1.0
    height: float = 1.0
    ride_height: float = _RIDE
    nose: float = 0.45
    tail: float = 0.45
    boat_tail: float = 0.0
    cabin: float = 0.45

    def __post_init__(self) -> None:
        for name, value in self.as_dict().items():
            lo = 0.0 if name in ("boat_tail", "ride_height") else 1e-3
            if not (np.isfinite(value) and value >= lo) or (name == "boat_tail" and value > 0.8):
                msg = (f"Morph {name}={value!r} is out of range (ranges drawn from: "
                       f"{MORPH_RANGES[name]})")
                raise ValueError(msg)

    def as_dict(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in MORPH_RANGES}

    @classmethod
    def sample(cls, rng: np.random.Generator) -> Morph:
        """One morph drawn uniformly from :data:`MORPH_RANGES`."""
        return cls(**{k: float(rng.uniform(lo, hi)) for k, (lo, hi) in MORPH_RANGES.items()})


def write_morph(path: Path, morph: Morph) -> Path:
    """``path`` (``geo_parameters_<i>.csv``): a header of parameter names and one row."""
    d = morph.as_dict()
    path.write_text(",".join(d) + "\n" + ",".join(f"{v:.6g}" for v in d.values()) + "\n")
    return path


def read_morph(run_dir: str | Path) -> Morph | None:
    """The :class:`Morph` recorded in ``run_dir/geo_parameters_<i>.csv``; None without one."""
    import csv

    found = sorted(Path(run_dir).glob("geo_parameters_*.csv"))
    if not found:
        return None
    with open(found[0], newline="") as fh:
        rows = list(csv.DictReader(fh))
    if len(rows) != 1:
        msg = f"{found[0]}: expected one data row under the header, found {len(rows)}"
        raise ValueError(msg)
    known = {k: float(v) for k, v in rows[0].items() if k in MORPH_RANGES}
    return Morph(**known)


@dataclass(frozen=True)
class SyntheticRun:
    """Paths of a generated run, its cell counts and the morph of its car."""

    run_dir: Path
    surface: Path
    volume: Path | None
    stl: Path | None
    surface_cells: int
    volume_cells: int
    stl_cells: int
    morph: Morph = Morph()
    #: ``geo_parameters_<i>.csv`` (the morph), or None for the baseline car
    parameters: Path | None = None


def _grid_size(cells: int) -> tuple[int, int]:
    """Rings ``nu`` and segments ``nv`` with ``(nu + 1) * nv`` close to ``cells``."""
    nv = max(8, 2 * round(np.sqrt(cells) / 2))
    nu = max(2, round(cells / nv) - 1)
    return nu, nv


def car_body(
    cells: int, morph: Morph | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Closed car-like surface with about ``cells`` cells, outward-oriented, shaped by
    ``morph`` (default: the baseline car).

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
    m = morph or Morph()
    e1 = np.where(uu < np.pi / 2, m.nose, m.tail)  # the side profile: front and rear halves
    e2 = 0.35

    def spow(x: np.ndarray, e) -> np.ndarray:
        return np.sign(x) * np.abs(x) ** e

    a, b, c = m.length * _LENGTH / 2, m.width * _WIDTH / 2, m.height * _HEIGHT / 2
    xn = -spow(np.cos(uu), e1)  # front (u=0) at x=-a: the flow comes from -x
    r = np.abs(np.sin(uu)) ** e1
    s = np.clip((xn - 0.3) / 0.7, 0.0, 1.0)
    r = r * (1.0 - m.boat_tail * s * s * (3 - 2 * s))  # taper towards the tail
    y = b * r * spow(np.cos(vv), e2)
    zr = r * spow(np.sin(vv), e2)
    cabin = (1.0 - m.cabin) + m.cabin * np.exp(-(((xn - 0.1) / 0.5) ** 2))
    z = np.where(zr > 0, c * 1.3 * zr * cabin, c * 0.55 * zr)
    x = a * xn
    for xw in (-0.6 * a, 0.62 * a):  # wheels: rounded bumps below the sills
        for yw in (-0.72 * b, 0.72 * b):
            z -= 0.22 * np.exp(-(((x - xw) / 0.38) ** 2 + ((y - yw) / 0.25) ** 2)) * (zr < 0)
    ring = np.stack([x, y, z], axis=-1).reshape(-1, 3)
    front = np.array([[-a, 0.0, 0.0]])
    back = np.array([[a, 0.0, 0.0]])
    points = np.concatenate([ring, front, back])
    points[:, 2] -= points[:, 2].min() - m.ride_height  # the ground at z = 0
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
    normals: np.ndarray, centres: np.ndarray, u_inf: float, rng: np.random.Generator,
    ride_height: float = _RIDE,
) -> dict[str, np.ndarray]:
    nx, nz = normals[:, 0], normals[:, 2]
    t = np.zeros_like(normals)
    t[:, 0] = 1.0
    t -= nx[:, None] * normals  # free stream projected on the surface
    tt = np.einsum("ij,ij->i", t, t)
    cp = 1.0 - 2.25 * tt**3  # suction peaks where the surface turns parallel to the flow
    wake = 1.0 / (1.0 + np.exp(-(nx - 0.1) / 0.08))
    cp = (1.0 - wake) * cp + wake * (-0.22 + 0.05 * np.sin(4 * centres[:, 2]))
    ground = 0.6 * np.sqrt(_RIDE / ride_height)  # underbody: weaker suction, more when low
    cp = np.where(nz < -0.5, ground * cp, cp)
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


def _volume(cells: int, u_inf: float, rng: np.random.Generator, morph: Morph):
    layers = int(max(3, min(40, round(cells ** (1 / 3) / 1.2))))
    base = max(16, cells // layers)
    points, offsets, conn = car_body(base, morph)
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
    morph: Morph | None = None,
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
    morph : Morph, optional
        The car's shape, recorded in ``geo_parameters_<index>.csv``; None: the baseline car
        (no such file). :func:`generate_runs` draws one per run.

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
    shape = morph or Morph()

    points, offsets, conn = car_body(surface_cells, shape)
    centres, normals, _ = polygon_geometry(points, offsets, conn)
    fields = _surface_fields(normals, centres, u_inf, rng, ride_height=shape.ride_height)
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
        vpoints, hexes, wedges, vfields = _volume(vcells, u_inf, rng, shape)
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
        sp, so, sc = car_body(max(16, scells // 2), shape)
        body = _polydata(sp, so, sc).triangulate()
        stl_path = run_dir / schema.stl_file.format(i=index)
        body.save(stl_path)
        n_stl = body.n_cells
    params = None
    if morph is not None:
        params = write_morph(run_dir / f"geo_parameters_{index}.csv", morph)
    log.info("synthetic run %s: %d surface, %d volume cells", run_dir, n_surface, n_volume)
    return SyntheticRun(run_dir, surface_path, volume_path, stl_path, n_surface, n_volume, n_stl,
                        shape, params)


def generate_runs(
    dst: str | Path,
    n_runs: int,
    *,
    cells: int = 200_000,
    volume_cells: int | None = 0,
    stl_cells: int | None = None,
    seed: int = 0,
    vary: bool = True,
    first_index: int = 1,
    schema: DatasetSchema = DRIVAERML,
) -> list[SyntheticRun]:
    """Write ``n_runs`` DrivaerML-like runs ``dst/run_<i>`` of different cars.

    Parameters
    ----------
    dst : path
        Parent directory (created).
    n_runs : int
        How many runs, numbered ``first_index, first_index + 1, ...``.
    cells, volume_cells, stl_cells : int
        Sizes, as in :func:`make_synthetic_run` (``volume_cells=0``: surfaces only; None:
        as many volume cells as surface cells).
    seed : int
        Seeds the morphs and the fields' noise: the same seed writes the same runs.
    vary : bool
        Draw a :class:`Morph` per run from :data:`MORPH_RANGES` (recorded in its
        ``geo_parameters_<i>.csv``); False: every run is the baseline car.

    Returns
    -------
    list of SyntheticRun

    Examples
    --------
    >>> runs = generate_runs("/tmp/raw", 3, cells=20_000, seed=1)  # doctest: +SKIP
    >>> sorted(runs[0].morph.as_dict())[:3]
    ['boat_tail', 'cabin', 'height']
    """
    if n_runs < 1:
        msg = f"n_runs={n_runs}: generate at least 1 run"
        raise ValueError(msg)
    if first_index < 0:
        msg = f"first_index={first_index}: run numbers are >= 0"
        raise ValueError(msg)
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_runs):
        morph = Morph.sample(rng) if vary else None
        run_seed = int(rng.integers(2**31))
        out.append(make_synthetic_run(dst, first_index + k, surface_cells=cells,
                                      volume_cells=volume_cells, seed=run_seed,
                                      stl_cells=stl_cells, schema=schema, morph=morph))
    return out
