"""One run's volume cells, read domain-parallel, and a volume model's inputs.

Sources are those of :mod:`~meshshard.apps.inputs`:

- a run directory ``run_<i>/``: every rank streams ``volume_<i>.vtu``
  (:func:`~meshshard.datasets.drivaerml.read_volume`; its cells' geometry is needed to write the
  copy back), keeps the rows ``[M r / W, M (r+1) / W)``, and the ranks partition them together;
- a meshshard store with a volume part: :func:`~meshshard.datasets.load_shard` when the world
  size divides its parts, else row slices, repartitioned;
- a physicsnemo-curator store (``volume_mesh_centers``, ``volume_fields``):
  :func:`~meshshard.datasets.curator.load_curator_shard`.

Every rank also keeps a slice ``[T r / W, T (r+1) / W)`` of the body's triangles (the run's
``drivaer_<i>.stl``, the store's ``stl_coordinates``/``stl_faces``): the inputs need each cell's
distance to the body, and :class:`~meshshard.ops.sdf.ShardedSurface` finds it with the triangles
spread over the ranks.

Inputs (:func:`volume_inputs`), the same in training and prediction: coordinates (1, m, 3) and
features (1, m, 2) = ``[d, log(|d| + 1e-6)]``, ``d`` the signed distance of the cell centre to
the body (positive outside), both standardised with the statistics of all ranks' cells. The
distances are taken ``max_cells_per_round`` cells a round (every rank runs the same number of
rounds; :mod:`~meshshard.apps.chunk_budgets`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshshard.apps.features import _standardise_into
from meshshard.apps.input_checks import check_volume_cells, check_volume_rows
from meshshard.apps.inputs import read_by_kind
from meshshard.datasets import load_shard
from meshshard.datasets.curator import curator_info, load_curator_shard
from meshshard.datasets.drivaerml import read_volume, run_index
from meshshard.datasets.schema import DRIVAERML, DatasetSchema
from meshshard.io.stl import read_stl
from meshshard.ops.sdf import ShardedSurface
from meshshard.partition.distributed import partition_distributed, redistribute_rows
from meshshard.store.curator_checks import read_block
from meshshard.store.format import SHARDED_PART_KEYS, StoreError, open_store, read_array

__all__ = ["VOLUME_FEATURES", "VolumeRows", "read_volume_rows", "volume_inputs"]

_KEYS = SHARDED_PART_KEYS["volume"]
#: what the features are (written into model checkpoints' ``inputs``)
VOLUME_FEATURES = "signed distance d to the STL, log(|d| + 1e-6) (standardised)"
_EPS = 1e-6


@dataclass
class VolumeRows:
    """This rank's volume rows of one run (numpy, in the rank's partition order).

    Attributes
    ----------
    centers : ndarray (m, 3) float32
    fields : ndarray (m, F) float32, non-dimensional (F = 0 without fields)
    perm : ndarray (m,) int64
        Source row (cell id in the ``.vtu``; row of the store) of each row.
    sizes : list of int
        Rows of every rank.
    columns, scales : dict
        As in :class:`~meshshard.apps.inputs.SurfaceRows`.
    triangles : ndarray (t, 3, 3) float64
        This rank's slice of the body's triangles.
    kind, name : str
    vtk : Path or None
        The ``.vtu`` (run directories), to copy with the predictions.
    n_source_cells : int
    """

    centers: np.ndarray
    fields: np.ndarray
    perm: np.ndarray
    sizes: list
    columns: dict
    scales: dict
    triangles: np.ndarray
    kind: str
    name: str
    vtk: Path | None = None
    n_source_cells: int = 0

    @property
    def n_total(self) -> int:
        return int(sum(self.sizes))


def _slice(n: int, rank: int, world: int) -> slice:
    return slice(n * rank // world, n * (rank + 1) // world)


def _partitioned(rows: dict[str, np.ndarray], group: Any, world: int) -> tuple[dict, list]:
    if world == 1:
        return rows, [int(rows["volume_mesh_centers"].shape[0])]
    dp = partition_distributed(rows["volume_mesh_centers"], world, group, "hilbert")
    return redistribute_rows(rows, dp, group), dp.sizes.tolist()


def _triangles(coords: np.ndarray, faces: np.ndarray) -> np.ndarray:
    return np.asarray(coords, dtype=np.float64)[np.asarray(faces, dtype=np.int64).reshape(-1, 3)]


def _no_stl(source: Any) -> StoreError:
    return StoreError(f"{source}: has no body (STL) to measure the volume cells' distance to; "
                      "a volume model's inputs need it (preprocess with --stl mesh or full)")


def _from_run(path: Path, group: Any, rank: int, world: int,
              base: DatasetSchema = DRIVAERML) -> VolumeRows:
    i = run_index(path)
    stl_path = path / base.stl_file.format(i=i)
    if not stl_path.is_file():
        raise _no_stl(path)
    stl = read_stl(stl_path)
    vtu = path / base.volume_file.format(i=i)
    if not vtu.is_file():
        msg = f"{path}: has no volume file {vtu.name}; a volume model predicts on its cells"
        raise FileNotFoundError(msg)
    # fields optional: a new car has none
    from dataclasses import replace

    schema = replace(base, volume_fields=tuple(replace(f, required=False)
                                               for f in base.volume_fields))
    check_volume_cells(vtu)  # a file of triangles is not a volume
    v = read_volume(vtu, schema=schema, length=stl.length)
    s = _slice(v.centers.shape[0], rank, world)
    rows = {"volume_mesh_centers": v.centers[s], "volume_fields": v.fields[s],
            "volume_perm": v.source_index[s]}
    meta = (v.columns, v.scales, v.n_source_cells)
    del v
    moved, sizes = _partitioned(rows, group, world)
    tri = _triangles(stl.coordinates, stl.faces[_slice(stl.faces.shape[0], rank, world)])
    return _rows(moved, sizes, meta, tri, "run", path.name, vtu)


def _from_store(path: Path, group: Any, rank: int, world: int) -> VolumeRows:
    g, attrs = open_store(path)
    va = attrs.get("volume")
    if va is None:
        msg = f"{path}: has no volume part; preprocess it with the volume"
        raise StoreError(msg)
    arrays = attrs.get("arrays", {})
    if "stl_coordinates" not in arrays or "stl_faces" not in arrays:
        raise _no_stl(path)
    nparts = int(attrs["nparts"])
    if nparts % world == 0:
        got = load_shard(path, rank, world, part="volume", keys=_KEYS)
        moved = {k: got[k].numpy() for k in _KEYS}
        sizes = got["sharding_sizes"].tolist()
    else:
        s = _slice(int(va["partition_ptr"][-1]), rank, world)
        rows = {k: read_array(g, path, k, s) for k in _KEYS}
        moved, sizes = _partitioned(rows, group, world)
    coords = read_array(g, path, "stl_coordinates")
    faces = read_array(g, path, "stl_faces").reshape(-1, 3)
    tri = _triangles(coords, faces[_slice(faces.shape[0], rank, world)])
    meta = (va.get("columns") or {}, va.get("scales") or {},
            int(va.get("n_source_cells") or sum(sizes)))
    return _rows(moved, sizes, meta, tri, "store", path.name.removesuffix(".zarr"), None)


def _from_curator(path: Path, group: Any, rank: int, world: int) -> VolumeRows:
    g, info = curator_info(path)
    if "volume" not in info["rows"]:
        msg = f"{path}: has no volume part (no volume_mesh_centers)"
        raise StoreError(msg)
    if "stl_coordinates" not in g or "stl_faces" not in g:
        raise _no_stl(path)
    got = load_curator_shard(path, rank, world, group=group, part="volume", keys=_KEYS)
    moved = {k: got[k].numpy() for k in _KEYS}
    coords = read_block(g["stl_coordinates"], path, "stl_coordinates")
    nf = int(g["stl_faces"].shape[0])
    flat = g["stl_faces"].ndim == 1
    t = nf // 3 if flat else nf
    s = _slice(t, rank, world)
    faces = read_block(g["stl_faces"], path, "stl_faces",
                       slice(3 * s.start, 3 * s.stop) if flat else s)
    meta = (info["columns"]["volume"], info["scales"]["volume"], info["rows"]["volume"])
    return _rows(moved, got["sharding_sizes"].tolist(), meta, _triangles(coords, faces),
                 "curator", path.name.removesuffix(".zarr"), None)


def _rows(moved, sizes, meta, tri, kind, name, vtk) -> VolumeRows:
    columns, scales, n_source = meta
    f = moved["volume_fields"]
    return VolumeRows(
        centers=np.ascontiguousarray(moved["volume_mesh_centers"], dtype=np.float32),
        fields=np.ascontiguousarray(f.reshape(f.shape[0], -1), dtype=np.float32),
        perm=np.ascontiguousarray(moved["volume_perm"], dtype=np.int64),
        sizes=[int(x) for x in sizes], columns=dict(columns), scales=dict(scales),
        triangles=np.ascontiguousarray(tri, dtype=np.float64), kind=kind, name=name, vtk=vtk,
        n_source_cells=int(n_source))


def read_volume_rows(source: str | Path, group: Any = None, *, fields: Any = None,
                     u_inf: float | None = None) -> VolumeRows:
    """This rank's volume rows of ``source`` and its slice of the body (module notes).

    A run directory's array names are mapped by ``fields``
    (:meth:`~meshshard.datasets.schema.DatasetSchema.with_fields`) and its fields scaled with
    the flow speed ``u_inf`` (default DrivaerML's); a store's are as it was preprocessed.

    Collective when ``torch.distributed`` runs more than one rank (except for a meshshard store
    whose parts the ranks divide): every rank of ``group`` must call it.

    Raises
    ------
    FileNotFoundError, ValueError
        No such source, no volume (``.vtu``, volume part), no STL; damaged files (named);
        a ``.vtu`` of surface cells; non-finite centres or truth
        (:mod:`~meshshard.apps.input_checks`).
    """
    from dataclasses import replace

    base = DRIVAERML.with_fields(fields)
    base = base if u_inf is None else replace(base, u_inf=float(u_inf))

    def run(path: Path, group: Any, rank: int, world: int) -> VolumeRows:
        return _from_run(path, group, rank, world, base)

    rows = read_by_kind(source, group, {"run": run, "store": _from_store,
                                        "curator": _from_curator})
    check_volume_rows(rows, source, group)  # every rank, before any model runs
    return rows


def _rounds(n: int, per_round: int, group: Any) -> int:
    """Rounds every rank runs: ceil(max_r n_r / per_round) (one all-reduce)."""
    import torch.distributed as dist

    t = torch.tensor([n], dtype=torch.int64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return max(1, -(-int(t) // per_round))


def distances(rows: VolumeRows, group: Any = None, max_cells_per_round: int | None = None
              ) -> torch.Tensor:
    """Signed distance (m,) float32 of this rank's cell centres to the body (collective:
    :class:`~meshshard.ops.sdf.ShardedSurface` over the ranks' triangles;
    ``max_cells_per_round`` centres a round, the same rounds on every rank; ``None``: one
    round). Unsigned when the STL is not closed (warned)."""
    surf = ShardedSurface(torch.from_numpy(rows.triangles), group=group)
    q = torch.from_numpy(rows.centers).double()
    m = q.shape[0]
    step = max_cells_per_round or max(m, 1)
    out = torch.empty(m, dtype=torch.float64)
    for r in range(_rounds(m, step, group)):
        a, b = min(r * step, m), min((r + 1) * step, m)
        out[a:b] = surf.signed_distance(q[a:b])
    return out.float()


def volume_inputs(rows: VolumeRows, group: Any = None, max_cells_per_round: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's model inputs: standardised coordinates (1, m, 3) and standardised features
    ``[d, log(|d| + 1e-6)]`` (1, m, 2), with the statistics of all ranks' cells (float64
    sums). Collective when distributed; the result does not depend on ``max_cells_per_round``."""
    d = distances(rows, group, max_cells_per_round)
    total = rows.n_total
    with torch.no_grad():
        feats = torch.stack([d, torch.log(d.abs() + _EPS)], dim=-1)
        _standardise_into(feats, feats, group, total)
        c = torch.from_numpy(rows.centers)
        coords = torch.empty_like(c)
        _standardise_into(coords, c, group, total)
    return coords.unsqueeze(0), feats.unsqueeze(0)
