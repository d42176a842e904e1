"""physicsnemo-curator zarr stores, read domain-parallel: no rank reads a whole part.

Layout (physicsnemo-curator's 2025 external-aerodynamics output, one zarr v3 store per run,
rows in the source mesh's order)::

    stl_coordinates (V, 3)  stl_centers (T, 3)  stl_faces (3T,) or (T, 3)  stl_areas (T,)
    surface_mesh_centers (N, 3)  surface_normals (N, 3)  surface_areas (N,)
    surface_fields (N, 4)        [pMeanTrim, wallShearStressMeanTrim x, y, z], raw units
    volume_mesh_centers (M, 3)   volume_fields (M, 5)  [UMeanTrim x, y, z, pMeanTrim,
                                                         nutMeanTrim], raw units
    global_params_values (G,)    global_params_reference (G,)   [stream velocity, air density]
    attrs: filename, dataset_type, stream_velocity, air_density, ... (ExternalAerodynamicsMetadata)

Fields are raw there (PhysicsNeMo's datapipes divide by ``air_density * stream_velocity**2`` when
loading); here they are made non-dimensional as meshshard's stores are (:mod:`.schema`):
pressure and wall shear ``/ (rho U^2)``, velocity ``/ U``, nut ``/ (U L)`` with ``L`` the STL's
extent along x. ``U`` and ``rho`` come from the attributes, else from
``global_params_reference``, else the schema's defaults (with a warning).

:func:`load_curator_shard` (collective): rank ``r`` of ``W`` reads rows ``[N r / W, N (r+1) / W)``
of each array (zarr reads only the chunks they touch), the ranks partition the centres together
(:func:`~meshshard.partition.distributed.partition_distributed`, ``W`` parts), and rows move to
the rank owning their part (:func:`~meshshard.partition.distributed.redistribute_rows`).
:func:`~meshshard.datasets.load_shard` calls it for curator stores, so
:class:`~meshshard.datasets.ShardedRunDataset` reads them beside meshshard's own stores.
:func:`write_curator_store` writes the layout from a run directory (for tests: the real dataset
is not here).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm.agree import raise_together
from meshshard.datasets.drivaerml import read_run
from meshshard.datasets.rows import target_device, wrap_rows
from meshshard.datasets.schema import DRIVAERML, DatasetSchema
from meshshard.partition import partition
from meshshard.partition.distributed import partition_distributed, redistribute_rows
from meshshard.store.curator_checks import (
    check_array_meta,
    check_flow,
    read_block,
    value_problems,
    verify_curator_store,
)
from meshshard.store.curator_checks import is_curator_store as _is_curator_store
from meshshard.store.format import PART_KEYS, SHARDED_PART_KEYS, STL_KEYS, StoreError

__all__ = ["CURATOR_COLUMNS", "curator_info", "is_curator_store", "load_curator_shard",
           "verify_curator_store", "write_curator_store"]

log = logging.getLogger(__name__)

#: field name -> (kind, columns) of surface_fields / volume_fields, as curator writes them
#: (the DrivaerML schema's required fields, in its order: the field table has one home)
CURATOR_COLUMNS = {
    part: tuple((f.name, f.kind, f.components) for f in fields if f.required)
    for part, fields in (("surface", DRIVAERML.surface_fields),
                         ("volume", DRIVAERML.volume_fields))
}
_PART_KEYS = PART_KEYS


def is_curator_store(path: str | Path) -> bool:
    """A zarr v3 group with curator's arrays and without meshshard's ``schema_version``."""
    return _is_curator_store(path)


def curator_info(path: str | Path, schema: DatasetSchema = DRIVAERML) -> tuple[Any, dict]:
    """``(group, info)``: info has ``rows`` per part, ``columns`` and ``scales`` per part (as in
    meshshard's store attributes), ``u_inf``, ``rho``, ``length``.

    Raises
    ------
    StoreError
        Missing or inconsistent arrays (named), fields of an unexpected width.
    """
    import zarr

    path = Path(path)
    if not is_curator_store(path):
        msg = f"{path}: not a physicsnemo-curator store (a zarr v3 group with surface_mesh_centers)"
        raise StoreError(msg)
    g = zarr.open_group(str(path), mode="r")
    # dtypes and chunk coverage of every array read below, before any is read
    for k in (*_PART_KEYS["surface"], *_PART_KEYS["volume"], *STL_KEYS):
        if k in g:
            check_array_meta(path, k)
    attrs = dict(g.attrs)
    u, rho = attrs.get("stream_velocity"), attrs.get("air_density")
    if (u is None or rho is None) and "global_params_reference" in g:
        ref = np.asarray(read_block(g["global_params_reference"], path,
                                    "global_params_reference"), dtype=float).ravel()
        if ref.size >= 2:
            u, rho = (u if u is not None else ref[0]), (rho if rho is not None else ref[1])
    if u is None or rho is None:
        log.warning("%s: no stream_velocity/air_density; using u_inf=%s rho=%s", path,
                    schema.u_inf, schema.rho)
        u, rho = schema.u_inf if u is None else u, schema.rho if rho is None else rho
    try:
        u, rho = float(u), float(rho)
    except (TypeError, ValueError):
        msg = f"{path}: stream_velocity={u!r} and air_density={rho!r} must be numbers"
        raise StoreError(msg) from None
    check_flow(path, u, rho)
    length = None
    if "stl_coordinates" in g:
        x = read_block(g["stl_coordinates"], path, "stl_coordinates", (slice(None), 0))
        length = float(x.max() - x.min()) if x.size else None
    info: dict[str, Any] = {"u_inf": u, "rho": rho, "length": length, "rows": {},
                            "columns": {}, "scales": {}, "attrs": attrs}
    for part, keys in _PART_KEYS.items():
        if keys[0] not in g:
            continue
        n = int(g[keys[0]].shape[0])
        for k in keys:
            if k not in g:
                msg = f"{path}: has {keys[0]} but no {k}"
                raise StoreError(msg)
            if int(g[k].shape[0]) != n:
                msg = f"{path}: {k} has {g[k].shape[0]} rows, {keys[0]} has {n}"
                raise StoreError(msg)
        width = int(np.prod(g[f"{part}_fields"].shape[1:], dtype=np.int64))
        cols, scales, c = {}, {}, 0
        for name, kind, comp in CURATOR_COLUMNS[part]:
            cols[name] = [c, c + comp]
            q = DatasetSchema(u_inf=u, rho=rho).scale(kind, length) if kind != "nut" or length \
                else None
            if q is None:
                msg = f"{path}: nutMeanTrim needs the STL (stl_coordinates) for its length scale"
                raise StoreError(msg)
            scales[name] = q
            c += comp
        if width != c:
            msg = (f"{path}: {part}_fields has {width} columns; curator's DrivaerML layout has "
                   f"{c} ({[n for n, _, _ in CURATOR_COLUMNS[part]]})")
            raise StoreError(msg)
        info["rows"][part], info["columns"][part], info["scales"][part] = n, cols, scales
    return g, info


def _factors(info: dict, part: str) -> np.ndarray:
    out = []
    for name, (a, b) in info["columns"][part].items():
        out += [info["scales"][part][name]] * (b - a)
    return np.asarray(out, dtype=np.float64)


def load_curator_shard(
    store: str | Path,
    rank: int,
    world_size: int,
    *,
    mesh: Any = None,
    group: Any = None,
    part: str = "surface",
    keys: Sequence[str] | None = None,
    method: str = "hilbert",
    device: Any = None,
) -> dict[str, Any]:
    """This rank's rows of a curator store, partitioned by all ranks together.

    Collective when ``world_size > 1``: every rank of ``mesh`` (or ``group``, else the default
    group) must call this. Returns what :func:`~meshshard.datasets.load_shard` returns (rows in
    partition order of ``world_size`` parts); ``<part>_perm`` (the row in the curator store)
    is added when asked for in ``keys``. Fields are non-dimensional (see the module notes).
    """
    import torch

    g, info = curator_info(store)
    if part == "stl":  # not sharded: every rank reads the body whole
        dev = target_device(mesh, device)
        out = {}
        for k in tuple(keys) if keys is not None else STL_KEYS:
            a = read_block(g[k], store, k)
            out[k] = torch.from_numpy(a.reshape(-1, 3) if k == "stl_faces" else a).to(dev)
        return out
    if part not in info["rows"]:
        msg = f"{store}: has no {part} part (no {part}_mesh_centers)"
        raise StoreError(msg)
    keys = tuple(keys) if keys is not None else _PART_KEYS[part]
    allowed = SHARDED_PART_KEYS[part]
    bad = [k for k in keys if k not in allowed]
    if bad:
        msg = f"{store}: unknown key(s) {bad} for part {part}; choose from {list(allowed)}"
        raise ValueError(msg)
    n = info["rows"][part]
    lo, hi = n * rank // world_size, n * (rank + 1) // world_size
    rows: dict[str, np.ndarray] = {}
    for k in _PART_KEYS[part]:
        if k in keys or k == f"{part}_mesh_centers":
            a = read_block(g[k], store, k, slice(lo, hi))
            rows[k] = a.astype(np.float32, copy=False) if a.dtype.kind == "f" else a
    if f"{part}_fields" in rows:
        f = rows[f"{part}_fields"]
        rows[f"{part}_fields"] = (f.reshape(f.shape[0], -1) / _factors(info, part)).astype(
            np.float32)
    bad_rows = int((~np.isfinite(rows[f"{part}_mesh_centers"])).any(axis=1).sum())
    rows[f"{part}_perm"] = np.arange(lo, hi, dtype=np.int64)
    # NaN/inf truth or geometry (centres: the partitioner's own check): every rank stops
    problem = value_problems(store, {k: v for k, v in rows.items()
                                     if k != f"{part}_mesh_centers"}, lo)
    if world_size == 1 and problem:
        raise StoreError(problem)
    if world_size > 1:
        raise_together(problem, mesh if mesh is not None else group, StoreError)
    if world_size == 1:
        if bad_rows:
            msg = f"{store}: {bad_rows} {part}_mesh_centers rows are not finite"
            raise StoreError(msg)
        order = partition(rows[f"{part}_mesh_centers"], 1, method=method).order
        moved = {k: v[order] for k, v in rows.items()}
        sizes = [n]
    else:
        grp = mesh if mesh is not None else group
        dp = partition_distributed(rows[f"{part}_mesh_centers"], world_size, grp, method)
        moved = redistribute_rows(rows, dp, grp)
        sizes = dp.sizes.tolist()
    return wrap_rows({k: moved[k] for k in keys}, mesh, sizes, target_device(mesh, device))


def write_curator_store(
    dst: str | Path,
    run_dir: str | Path,
    *,
    schema: DatasetSchema = DRIVAERML,
    chunk_bytes: int = 1 << 20,
    volume: bool = True,
) -> Path:
    """Write a run directory (``boundary_i.vtp``, ``volume_i.vtu``, ``drivaer_i.stl``) in
    physicsnemo-curator's zarr layout (raw fields, Blosc-zstd level 5, ~1 MB chunks) to
    ``dst`` (a ``.zarr`` directory). For tests and demos; rows stay in the source order."""
    import zarr
    from zarr.codecs import BloscCodec


    run = read_run(run_dir, schema=schema, volume=volume)
    comp = BloscCodec(cname="zstd", clevel=5, shuffle="shuffle")
    dst = Path(dst)
    g = zarr.open_group(str(dst), mode="w", zarr_format=3)

    def put(name: str, a: np.ndarray) -> None:
        row = max(1, int(a.itemsize * np.prod(a.shape[1:], dtype=np.int64)))
        ch = (max(1, min(a.shape[0] or 1, chunk_bytes // row)), *a.shape[1:])
        g.create_array(name, shape=a.shape, dtype=a.dtype, chunks=ch, compressors=comp)
        if a.size:
            g[name][...] = a

    def raw(data, part: str) -> np.ndarray:
        cols = []
        for name, _, _ in CURATOR_COLUMNS[part]:
            a, b = data.columns[name]
            cols.append(data.fields[:, a:b] * np.float32(data.scales[name]))
        return np.concatenate(cols, axis=1).astype(np.float32)

    if run.stl is not None:
        put("stl_coordinates", run.stl.coordinates.astype(np.float32))
        put("stl_centers", run.stl.centers.astype(np.float32))
        put("stl_faces", run.stl.faces.reshape(-1).astype(np.int32))
        put("stl_areas", run.stl.areas.astype(np.float32))
    s = run.surface
    put("surface_mesh_centers", s.centers)
    put("surface_normals", s.normals)
    put("surface_areas", s.areas)
    put("surface_fields", raw(s, "surface"))
    if run.volume is not None:
        put("volume_mesh_centers", run.volume.centers)
        put("volume_fields", raw(run.volume, "volume"))
    params = np.asarray([schema.u_inf, schema.rho], dtype=np.float32)
    put("global_params_values", params)
    put("global_params_reference", params)
    lo, hi = s.centers.min(axis=0), s.centers.max(axis=0)
    g.attrs.update({"filename": Path(run_dir).name, "dataset_type": "surface",
                    "stream_velocity": schema.u_inf, "air_density": schema.rho,
                    "x_bound": [float(lo[0]), float(hi[0])],
                    "y_bound": [float(lo[1]), float(hi[1])],
                    "z_bound": [float(lo[2]), float(hi[2])],
                    "num_points": None, "num_faces": int(s.centers.shape[0]),
                    "zarr_format": 3})
    return dst
