"""Domain-parallel training of the reference Transolver on one sharded DrivaerML-like run.

Used by ``meshshard demo``, ``examples/train_drivaerml.py`` and ``benchmarks/bench_memory.py``.
Every rank loads only its rows of the store (:func:`meshshard.datasets.load_shard`), adds
kNN-based geometric features with :mod:`meshshard.ops` (exact across shard boundaries), and
trains the *unmodified* :class:`~meshshard.models.Transolver` on ShardTensors: the loss is a
true global mean and weight gradients equal the single-device ones.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from meshshard import ops
from meshshard.datasets import load_shard
from meshshard.models import Transolver
from meshshard.shardtensor import bucket_weight_grads
from meshshard.store.atomic import publish, resolve

log = logging.getLogger(__name__)

__all__ = [
    "TrainConfig",
    "build_inputs",
    "geometric_features",
    "load_sample",
    "make_model",
    "relative_l2",
    "save_checkpoint",
    "load_checkpoint",
    "split_runs",
    "train_steps",
]


def split_runs(runs: list[Any], val_fraction: float) -> tuple[list[Any], list[Any], str | None]:
    """Hold out the first ``round(len(runs) * val_fraction)`` runs (at least one, never all)
    for validation: ``(train, val, note)``.

    ``note`` is what a user must be told (None when the split is what was asked): one run
    cannot be split, so it trains with no validation set, and saying nothing would leave the
    user believing a held-out error was reported. ``val_fraction=0`` asks for no validation.

    Raises
    ------
    ValueError
        ``val_fraction`` outside [0, 1).

    Examples
    --------
    >>> split_runs(["a", "b", "c", "d", "e"], 0.2)[:2]
    (['b', 'c', 'd', 'e'], ['a'])
    >>> train, val, note = split_runs(["a"], 0.2)
    >>> train, val, note.split(":")[0]
    (['a'], [], 'only 1 run')
    """
    if not (math.isfinite(val_fraction) and 0 <= val_fraction < 1):
        msg = f"--val-fraction {val_fraction:g} must be >= 0 and < 1 (the share of runs held out)"
        raise ValueError(msg)
    if val_fraction == 0:
        return list(runs), [], None
    if len(runs) < 2:
        note = (
            f"only {len(runs)} run: no validation set (nothing is held out; the model is trained "
            "on that run and no held-out error is reported); add runs, or pass --val-fraction 0 "
            "to say so"
        )
        return list(runs), [], note
    n_val = min(len(runs) - 1, max(1, round(len(runs) * val_fraction)))
    return list(runs[n_val:]), list(runs[:n_val]), None


@dataclass
class TrainConfig:
    """What a training run needs; JSON-serialisable (stored in checkpoints)."""

    steps: int = 30
    lr: float = 2e-3
    knn: int = 8
    n_hidden: int = 32
    n_layers: int = 2
    heads: int = 2
    slices: int = 16
    seed: int = 0
    model: dict = field(default_factory=dict)

    def model_kwargs(self, fun_dim: int, out_dim: int) -> dict:
        kw = dict(space_dim=3, fun_dim=fun_dim, out_dim=out_dim, n_hidden=self.n_hidden,
                  n_layers=self.n_layers, heads=self.heads, slices=self.slices)
        kw.update(self.model)
        return kw


def geometric_features(coords: torch.Tensor, normals: torch.Tensor, k: int) -> torch.Tensor:
    """Per-point features from the k nearest neighbours over *all* ranks.

    Columns: log mean neighbour distance, log distance to the k-th neighbour, mean agreement
    of the neighbours' normals with the point's own normal (a curvature proxy), and the
    offset of the point from its neighbours' centroid along its normal.

    Collective (exact distributed kNN + neighbour gather): every rank must call this.

    Parameters
    ----------
    coords, normals : ShardTensor of shape (N, 3), Shard(0) (or plain Tensors on one process)
    k : int

    Returns
    -------
    Tensor of shape (N, 4), sharded like ``coords``.
    """
    dist_, idx = ops.knn(coords, k, loop=False)
    # one exchange for both: the same neighbour rows are requested for coordinates and normals
    nb = ops.gather_neighbors(torch.cat([coords, normals], dim=-1), idx)  # (N, k, 6)
    return features_from_neighbours(coords, normals, dist_, nb, k)


def features_from_neighbours(coords: torch.Tensor, normals: torch.Tensor, dist_: torch.Tensor,
                             nb: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`geometric_features` of rows whose neighbour distances (n, k) and neighbour
    coordinates + normals (n, k, 6) are known (pointwise: any subset of rows)."""
    nb_coords, nb_normals = nb[..., :3], nb[..., 3:]
    mean_d = torch.log(dist_.mean(dim=1, keepdim=True) + 1e-6)
    kth_d = torch.log(dist_[:, k - 1 :] + 1e-6)
    agree = (nb_normals * normals.unsqueeze(1)).sum(dim=-1).mean(dim=1, keepdim=True)
    centroid = nb_coords.mean(dim=1)
    bulge = ((coords - centroid) * normals).sum(dim=-1, keepdim=True)
    scale = dist_.mean(dim=1, keepdim=True) + 1e-6
    return torch.cat([mean_d, kth_d, agree, bulge / scale], dim=-1)


def _standardise(x: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit variance per column with *global* statistics."""
    mean = x.mean(dim=0, keepdim=True)
    std = x.std(dim=0, keepdim=True)
    return (x - mean) / (std + 1e-6)


def load_sample(
    store: str | Path,
    rank: int,
    world_size: int,
    mesh: Any,
    *,
    knn: int,
    standardise_target: bool = True,
) -> dict[str, Any]:
    """Inputs and targets for one run store, sharded over ``mesh`` (collective: kNN features).

    Coordinates and geometric features are standardised with the sample's global statistics;
    targets too unless ``standardise_target=False`` (keep the store's non-dimensional fields,
    e.g. for validation errors in physical units).

    Returns ``{"coords": (1, N, 3), "features": (1, N, 3 + 4), "target": (1, N, C)}``.
    """
    keys = ("surface_mesh_centers", "surface_normals", "surface_fields")
    data = load_shard(store, rank, world_size, mesh=mesh, part="surface", keys=keys)
    coords = data["surface_mesh_centers"].float()
    normals = data["surface_normals"].float()
    target = data["surface_fields"].float()
    coords_n, features = build_inputs(coords, normals, knn=knn)
    with torch.no_grad():
        if standardise_target:
            target = _standardise(target)
    return {"coords": coords_n, "features": features, "target": target.unsqueeze(0)}


def build_inputs(coords: torch.Tensor, normals: torch.Tensor, *, knn: int):
    """The model's inputs from centres and normals (N, 3): standardised coordinates
    (1, N, 3) and features (1, N, 3 + 4) = normals and standardised kNN features, with the
    sample's global statistics. Collective when sharded (kNN, means)."""
    with torch.no_grad():
        geo = _standardise(geometric_features(coords, normals, knn))
        coords_n = _standardise(coords)
    features = torch.cat([normals, geo], dim=-1)
    return coords_n.unsqueeze(0), features.unsqueeze(0)


def make_model(cfg: TrainConfig, fun_dim: int, out_dim: int) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)
    return Transolver(**cfg.model_kwargs(fun_dim, out_dim))


def relative_l2(pred: torch.Tensor, target: torch.Tensor, columns: slice) -> float:
    """||pred - target|| / ||target|| over the given columns (global; collective when
    sharded)."""
    p, t = pred[..., columns], target[..., columns]
    num = ((p - t) ** 2).sum()
    den = (t**2).sum()
    return math.sqrt(float(num.item()) / max(float(den.item()), 1e-30))


def _can_bucket(model: torch.nn.Module) -> bool:
    """Whether ``backward`` may sum the weights' gradients at its end (``bucket_weight_grads``):
    not under DDP or FSDP, whose reducers hook each weight's gradient accumulation."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    wrappers = (DistributedDataParallel, FSDPModule, FullyShardedDataParallel)
    return not any(isinstance(m, wrappers) for m in model.modules())


def train_steps(
    model: torch.nn.Module,
    sample: dict[str, Any],
    cfg: TrainConfig,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    start_step: int = 0,
    on_step: Callable[[int, float, float], None] | None = None,
) -> list[float]:
    """Run ``cfg.steps - start_step`` full-sample Adam steps; return the loss of every step.

    Collective when the sample is sharded (``loss.item()`` all-reduces).
    """
    opt = optimizer or torch.optim.Adam(model.parameters(), lr=cfg.lr)
    bucket = _can_bucket(model)
    losses = []
    for step in range(start_step, cfg.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        pred = model(sample["coords"], sample["features"])
        loss = ((pred - sample["target"]) ** 2).mean()
        with bucket_weight_grads(bucket):  # one weight-gradient sum, not one per layer
            loss.backward()
        opt.step()
        value = float(loss.item())
        losses.append(value)
        if on_step is not None:
            on_step(step, value, time.perf_counter() - t0)
    return losses


def save_checkpoint(path: str | Path, model, optimizer, step: int, cfg: TrainConfig,
                    extra: dict | None = None) -> Path:
    """Write atomically (temporary name, fsync, then :func:`~meshshard.store.atomic.publish`):
    a crash never leaves a torn file, and ``PATH`` or ``PATH.old`` is complete at every
    instant (:func:`load_checkpoint` falls back to ``PATH.old``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    payload = {
        "format": "meshshard-checkpoint-1",
        "step": int(step),
        "config": asdict(cfg),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "extra": extra or {},
    }
    with open(tmp, "wb") as fh:
        torch.save(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    publish(tmp, path, path.with_name(path.name + ".old"))
    return path


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint with ``weights_only=True``; a corrupt or foreign file raises
    ValueError naming it (nothing is overwritten). A ``PATH.old`` left by a save that was
    interrupted between its renames is read when ``PATH`` is missing."""
    path = Path(path)
    path = resolve(path, path.with_name(path.name + ".old")) or path
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:
        msg = f"{path}: corrupt or unreadable checkpoint ({type(exc).__name__}: {exc})"
        raise ValueError(msg) from exc
    if not isinstance(payload, dict) or payload.get("format") != "meshshard-checkpoint-1":
        msg = f"{path}: not a meshshard checkpoint"
        raise ValueError(msg)
    return payload
