"""One run's surface, read domain-parallel from any of the sources ``predict``/``evaluate`` take.

Sources:

- a run directory ``run_<i>/`` (``boundary_<i>.vtp``): every rank reads the surface file (its
  cells' geometry is needed to write the VTK back), keeps the rows ``[N r / W, N (r+1) / W)``,
  and the ranks partition them together;
- a meshshard store ``run_<i>.zarr``: :func:`~meshshard.datasets.load_shard` when the world
  size divides its parts (no collective, no repartition), else each rank reads a row slice and
  the ranks repartition;
- a physicsnemo-curator store: :func:`~meshshard.datasets.curator.load_curator_shard`.

Every path returns this rank's rows (its part of the partition), sorted along a Hilbert curve
of their centres so that consecutive rows are close in space (the streamed kNN relies on it for
its memory bound, not for its answer), with the source row of each (``perm``) and every rank's
row count. Fields are non-dimensional; missing fields are allowed
(a new car has none), they are simply absent from ``columns``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.apps.input_checks import check_surface_rows
from meshshard.datasets import load_shard
from meshshard.datasets.curator import curator_info, is_curator_store, load_curator_shard
from meshshard.datasets.drivaerml import read_surface, run_index
from meshshard.datasets.schema import DRIVAERML, DatasetSchema
from meshshard.partition.distributed import partition_distributed, redistribute_rows
from meshshard.partition.sfc import hilbert_codes
from meshshard.store.format import SHARDED_PART_KEYS, StoreError, open_store, read_array

__all__ = ["SurfaceRows", "read_surface_rows", "reading_options", "run_schema", "source_kind"]

log = logging.getLogger(__name__)

_KEYS = SHARDED_PART_KEYS["surface"]


@dataclass
class SurfaceRows:
    """This rank's surface rows of one run (numpy, Hilbert order within the rank's part).

    Attributes
    ----------
    centers, normals : ndarray (n, 3) float32
    areas : ndarray (n,) float32
    fields : ndarray (n, F) float32, non-dimensional (F = 0 without fields)
    perm : ndarray (n,) int64
        Source row (cell id in the VTK file; row in the store's source order) of each row.
    sizes : list of int
        Rows of every rank.
    columns : dict name -> [start, stop]
    scales : dict name -> factor the raw values were divided by
    u_inf, rho : float
    kind : {"run", "store", "curator"}
    name : str
        Run name (``run_3``).
    vtk : Path or None
        The surface VTK file (run directories), to copy with the predictions.
    n_source_cells : int
    conventions : dict
        Which way the normals point and which side's shear the fields hold
        (:mod:`~meshshard.datasets.conventions`; empty for a store written before they were
        recorded).
    u_inf_from : str
        Where ``u_inf`` came from (``--u-inf``, the model file, the store, the default).
    """

    centers: np.ndarray
    normals: np.ndarray
    areas: np.ndarray
    fields: np.ndarray
    perm: np.ndarray
    sizes: list
    columns: dict
    scales: dict
    u_inf: float
    rho: float
    kind: str
    name: str
    vtk: Path | None = None
    n_source_cells: int = 0
    extra: dict = field(default_factory=dict)
    conventions: dict = field(default_factory=dict)
    u_inf_from: str = ""

    @property
    def n_total(self) -> int:
        return int(sum(self.sizes))


def source_kind(path: str | Path) -> str:
    """``"run"``, ``"store"`` or ``"curator"``; FileNotFoundError/ValueError otherwise."""
    p = Path(path)
    if not p.exists():
        msg = f"{p}: no such run directory or store"
        raise FileNotFoundError(msg)
    if is_curator_store(p):
        return "curator"
    if (p / "zarr.json").is_file():
        return "store"
    if p.is_dir():
        return "run"
    msg = f"{p}: neither a run directory (run_<i>/ with boundary_<i>.vtp) nor a zarr store"
    raise ValueError(msg)


def _rank_world(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def read_by_kind(source: str | Path, group: Any, readers: dict[str, Any]) -> Any:
    """``readers[source_kind(source)](path, group, rank, world)``: the one dispatch of a run
    directory, a meshshard store or a curator store to its reader (surface or volume rows)."""
    path = Path(source)
    rank, world = _rank_world(group)
    return readers[source_kind(path)](path, group, rank, world)


def _curve_order(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This rank's rows sorted along a Hilbert curve of its own centres: consecutive rows are
    then close in space, which is what keeps the streamed kNN's rounds small
    (:func:`meshshard.ops.knn_chunks`) whatever the file's cell order. ``surface_perm`` moves
    with the rows, so the predictions still go back to their cells."""
    c = rows["surface_mesh_centers"]
    if c.shape[0] < 2:
        return rows
    order = np.argsort(hilbert_codes(c), kind="stable")
    return {k: v[order] for k, v in rows.items()}


def _partitioned(rows: dict[str, np.ndarray], group: Any, world: int) -> tuple[dict, list]:
    if world == 1:
        return _curve_order(rows), [int(rows["surface_mesh_centers"].shape[0])]
    dp = partition_distributed(rows["surface_mesh_centers"], world, group, "hilbert")
    return _curve_order(redistribute_rows(rows, dp, group)), dp.sizes.tolist()


def _slice(n: int, rank: int, world: int) -> tuple[int, int]:
    return n * rank // world, n * (rank + 1) // world


def run_schema(fields: Any = None, u_inf: float | None = None, *, normals: str = "auto",
               shear: str = "on_fluid") -> DatasetSchema:
    """The schema a run directory is read with for predict/evaluate: DrivaerML's, every
    surface field optional (a new car has none), the file's names mapped by ``fields``
    (:meth:`~meshshard.datasets.schema.DatasetSchema.with_fields`), the flow speed ``u_inf``
    when given, and the file's conventions (:mod:`~meshshard.datasets.conventions`)."""
    schema = DRIVAERML.with_fields(fields)
    schema = replace(schema, surface_fields=tuple(replace(f, required=False)
                                                  for f in schema.surface_fields),
                     normals=normals, shear=shear)
    return schema if u_inf is None else replace(schema, u_inf=float(u_inf))


def _from_run(path: Path, group: Any, rank: int, world: int, schema: DatasetSchema | None = None,
              u_inf_from: str = "") -> SurfaceRows:
    i = run_index(path)
    schema = schema or run_schema()
    vtp = path / schema.surface_file.format(i=i)
    s = read_surface(vtp, schema=schema)
    lo, hi = _slice(s.centers.shape[0], rank, world)
    rows = {"surface_mesh_centers": s.centers[lo:hi], "surface_normals": s.normals[lo:hi],
            "surface_areas": s.areas[lo:hi], "surface_fields": s.fields[lo:hi],
            "surface_perm": s.source_index[lo:hi]}
    n_source, meta, conv = s.n_source_cells, (s.columns, s.scales), s.conventions
    del s
    moved, sizes = _partitioned(rows, group, world)
    out = _rows(moved, sizes, meta, "run", path.name, vtp, n_source, schema.u_inf, schema.rho)
    out.conventions, out.u_inf_from = conv, u_inf_from or "DrivaerML default"
    return out


def _rows(moved, sizes, meta, kind, name, vtk, n_source, u_inf, rho) -> SurfaceRows:
    columns, scales = meta
    f = moved["surface_fields"]
    return SurfaceRows(
        centers=np.ascontiguousarray(moved["surface_mesh_centers"], dtype=np.float32),
        normals=np.ascontiguousarray(moved["surface_normals"], dtype=np.float32),
        areas=np.ascontiguousarray(moved["surface_areas"], dtype=np.float32),
        fields=np.ascontiguousarray(f.reshape(f.shape[0], -1), dtype=np.float32),
        perm=np.ascontiguousarray(moved["surface_perm"], dtype=np.int64),
        sizes=[int(x) for x in sizes], columns=dict(columns), scales=dict(scales),
        u_inf=float(u_inf), rho=float(rho), kind=kind, name=name, vtk=vtk,
        n_source_cells=int(n_source))


def _from_store(path: Path, group: Any, rank: int, world: int) -> SurfaceRows:
    g, attrs = open_store(path)
    sa = attrs.get("surface")
    if sa is None:
        msg = f"{path}: has no surface part; preprocess it with --surface"
        raise StoreError(msg)
    keys = [k for k in _KEYS if k in attrs.get("arrays", {})]
    if "surface_fields" not in keys or "surface_perm" not in keys:
        msg = f"{path}: lacks surface_fields or surface_perm; rerun meshshard preprocess"
        raise StoreError(msg)
    ds = attrs.get("dataset") or {}
    u_inf, rho = ds.get("u_inf", 38.889), ds.get("rho", 1.0)
    nparts = int(attrs["nparts"])
    if nparts % world == 0:
        got = load_shard(path, rank, world, part="surface", keys=keys)
        moved = _curve_order({k: got[k].numpy() for k in keys})
        sizes = got["sharding_sizes"].tolist()
    else:
        n = int(sa["partition_ptr"][-1])
        lo, hi = _slice(n, rank, world)
        rows = {k: read_array(g, path, k, slice(lo, hi)) for k in keys}
        moved, sizes = _partitioned(rows, group, world)
    n_source = int(sa.get("n_source_cells") or sum(sizes))
    out = _rows(moved, sizes, (sa.get("columns") or {}, sa.get("scales") or {}), "store",
                path.name.removesuffix(".zarr"), None, n_source, u_inf, rho)
    out.conventions, out.u_inf_from = dict(sa.get("conventions") or {}), "store"
    return out


def _from_curator(path: Path, group: Any, rank: int, world: int) -> SurfaceRows:
    _, info = curator_info(path)
    got = load_curator_shard(path, rank, world, group=group, part="surface", keys=_KEYS)
    moved = _curve_order({k: got[k].numpy() for k in _KEYS})
    return _rows(moved, got["sharding_sizes"].tolist(),
                 (info["columns"]["surface"], info["scales"]["surface"]), "curator",
                 path.name.removesuffix(".zarr"), None, info["rows"]["surface"],
                 info["u_inf"], info["rho"])


def reading_options(source: str | Path, mf: Any = None, *, u_inf: float | None = None,
                    fields: Any = None, normals: str = "auto", shear: str = "on_fluid"
                    ) -> dict[str, Any]:
    """The keywords of :func:`read_surface_rows` for ``source`` read for the model file ``mf``
    (or None): on a run directory, ``u_inf`` is ``--u-inf``, else the speed the model was
    trained with (its recorded ``scales["u_inf"]``), else DrivaerML's default with a warning;
    the field map is ``fields``, else the one the model's training data was read with. On a
    store only a given ``u_inf`` is passed (checked against the store's).

    Raises
    ------
    ValueError
        ``u_inf`` not finite and > 0.
    """
    if u_inf is not None and not (math.isfinite(u_inf) and u_inf > 0):
        msg = f"--u-inf {u_inf}: the free-stream speed must be a finite number > 0 (m/s)"
        raise ValueError(msg)
    scales = getattr(mf, "scales", None) or {}
    if fields is None and scales.get("field_sources"):
        fields = {src: name for name, src in scales["field_sources"].items()}
    out: dict[str, Any] = {"fields": fields, "u_inf": u_inf, "normals": normals,
                           "shear": shear, "u_inf_from": "--u-inf" if u_inf is not None else ""}
    if u_inf is None and Path(source).is_dir() and source_kind(source) == "run":
        if scales.get("u_inf"):
            out.update(u_inf=float(scales["u_inf"]), u_inf_from=f"model file {mf.path}")
        else:
            log.warning("%s: no --u-inf and no model file speed: the fields are scaled with "
                        "DrivaerML's u_inf=%g m/s; pass --u-inf for another flow speed",
                        source, DRIVAERML.u_inf)
    return out


def read_surface_rows(source: str | Path, group: Any = None, *, fields: Any = None,
                      u_inf: float | None = None, u_inf_from: str = "", normals: str = "auto",
                      shear: str = "on_fluid") -> SurfaceRows:
    """This rank's surface rows of ``source`` (see the module notes).

    ``fields`` maps a run directory's array names onto the schema's (``"p=pMeanTrim,..."``,
    a dict or a preset, see :func:`run_schema`) and ``u_inf`` is its flow speed (default
    DrivaerML's, with ``u_inf_from`` saying where a given one came from). A store's fields
    are non-dimensional with its own recorded speed: ``u_inf`` must then agree with it.
    ``normals`` and ``shear`` state a run directory's conventions
    (:mod:`~meshshard.datasets.conventions`; a store holds OpenFOAM's already).

    Collective when ``torch.distributed`` is initialised with more than one rank (except for
    a meshshard store whose parts the ranks divide): every rank of ``group`` must call it.

    Raises
    ------
    FileNotFoundError, ValueError
        No such source; not a run directory or store; damaged files (named); geometry or
        truth unfit for the model (:func:`~meshshard.apps.input_checks.check_surface_rows`).
    """
    schema = run_schema(fields, u_inf, normals=normals, shear=shear)

    def run(path: Path, group: Any, rank: int, world: int) -> SurfaceRows:
        return _from_run(path, group, rank, world, schema, u_inf_from if u_inf else "")

    rows = read_by_kind(source, group, {"run": run, "store": _from_store,
                                        "curator": _from_curator})
    if u_inf is not None and rows.kind != "run" and not math.isclose(u_inf, rows.u_inf,
                                                                     rel_tol=1e-6):
        msg = (f"{source}: its fields are non-dimensional with its own u_inf={rows.u_inf:g} "
               f"m/s, not {u_inf:g} ({u_inf_from or '--u-inf'}); --u-inf applies to run "
               "directories, a store keeps the speed it was preprocessed with")
        raise ValueError(msg)
    check_surface_rows(rows, source, group)  # every rank, before any model runs
    return rows
