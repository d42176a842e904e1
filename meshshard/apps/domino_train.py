"""DoMINO on DrivaerML run stores, domain-parallel: inputs, the training loop, and the
one-process comparison that ``examples/train_drivaerml.py --model domino`` prints and plots.

Per rank and run: its slice of the STL's triangles (the SDF on the latent grid is computed from
them by :class:`meshshard.ops.sdf.ShardedSurface`; no rank needs all), its slice of the STL
vertices (the geometry encoding's points), its surface cells (the store's partition: the
sampled points, with normals as point features, standardised fields as targets) and its slab
of the latent grid (or the whole grid, ``grid_layout="replicated"``). The grid's box is the
STL's, enlarged by 10 % on every side, and is checked to cover the points.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from meshshard.datasets import load_shard
from meshshard.models.domino import DoMINO
from meshshard.ops.domino_ops import allreduce_grads
from meshshard.ops.gridpoint import GridLayout
from meshshard.ops.sdf import ShardedSurface, grid_sdf
from meshshard.shardtensor import Replicate, Shard, from_local
from meshshard.store.format import StoreError

__all__ = ["domino_sample", "make_domino", "train_domino"]

log = logging.getLogger(__name__)


def _split(n: int, rank: int, world: int) -> slice:
    return slice(n * rank // world, n * (rank + 1) // world)


def domino_sample(store: str | Path, rank: int, world: int, group, *, grid_shape,
                  grid_layout: str = "slab", device=None) -> dict[str, Any]:
    """This rank's DoMINO inputs for one run store, on ``device`` (default: the CPU; with a
    NCCL group, this rank's GPU). Collective over ``group`` (SDF, stats)."""
    dev = torch.device("cpu") if device is None else torch.device(device)
    try:
        stl = load_shard(store, 0, 1, part="stl", keys=("stl_coordinates", "stl_faces"))
    except StoreError as exc:
        if "no array 'stl_" not in str(exc):
            raise
        msg = (f"{store}: has no STL (its run had none, or it was preprocessed with --surface "
               "or --stl none); DoMINO reads the body's triangles: preprocess the run with its "
               "STL and --stl mesh")  # fmt: skip
        raise StoreError(msg) from None
    verts = stl["stl_coordinates"].to(dev, torch.float64)
    tri = verts[stl["stl_faces"].to(dev).long()]
    surf = load_shard(store, rank, world, part="surface",
                      keys=("surface_mesh_centers", "surface_normals", "surface_fields"))
    surf = {k: v.to(dev) for k, v in surf.items()}
    lo, hi = verts.amin(0), verts.amax(0)
    pad = 0.1 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    shape = tuple(int(s) for s in grid_shape)
    spacing = ((hi - lo) / (torch.tensor(shape[::-1], dtype=torch.float64, device=dev) - 1)
               ).tolist()
    D = shape[0]
    sizes = [len(range(D)[_split(D, r, world)]) for r in range(world)]
    layout = GridLayout(shape, lo.tolist(), spacing,
                        sizes=sizes if grid_layout == "slab" else None)
    pts = surf["surface_mesh_centers"].float()
    layout.check_covers(pts, group, what="surface points")
    surface = ShardedSurface(tri[_split(len(tri), rank, world)], group=group)
    sdf = grid_sdf(surface, layout, dtype=torch.float32)
    target = surf["surface_fields"].float()
    t64 = target.double()
    stats = torch.cat([t64.sum(0), torch.tensor([float(len(t64))], dtype=torch.float64,
                                                 device=dev)])
    dist.all_reduce(stats, group=group)  # two passes: no cancellation in E[x^2] - E[x]^2
    n = stats[-1]
    mean = stats[:-1] / n
    var = ((t64 - mean) ** 2).sum(0)
    dist.all_reduce(var, group=group)
    std = (var / n).sqrt() + 1e-12
    return {"stl": verts[_split(len(verts), rank, world)].float(), "sdf": sdf, "points": pts,
            "normals": surf["surface_normals"].float(),
            # standardised in float64: the stats' summation order (by rank) stays below fp32
            "target": ((t64 - mean) / std).float(), "layout": layout}


def make_domino(layout, out_channels: int, ops, *, hidden: int = 32, device=None):
    """A small surface DoMINO sized from the grid's spacing, on ``device`` (default CPU)."""
    h = max(layout.spacing)
    torch.manual_seed(0)  # initialised on the CPU: the same weights on every device
    return DoMINO(layout.shape, layout.origin, layout.spacing, radii=(1.5 * h, 3.0 * h),
                  neighbors=(16, 32), local_radii=(0.5 * h, 1.0 * h), local_neighbors=(8, 16),
                  n_neighbors=7, point_features=3, out_channels=out_channels,
                  geo_channels=8, hidden=hidden, blocks=2, ops=ops).to(device)


def train_domino(samples: list[dict], model, *, steps: int, lr: float, group=None,
                 sharded: bool = True, mesh=None) -> list[float]:
    """Adam on the global mean squared error; returns the loss of every step.

    With ``mesh`` (the model's ``ShardedDominoOps`` mesh, 1-D) the samples' pieces are wrapped
    as ShardTensors and the step is the plain one: a ShardTensor mean, ``loss.backward()``,
    ``opt.step()`` (the ops sum the parameters' gradients). Without it and ``sharded=True``,
    each rank's loss is its share and ``allreduce_grads`` sums the gradients over ``group``.
    Collective every step when sharded.
    """
    if mesh is not None:
        samples = [_as_shardtensors(s, mesh) for s in samples]
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        s = samples[step % len(samples)]
        opt.zero_grad(set_to_none=True)
        out = model(s["stl"], s["sdf"], s["points"], s["normals"])
        if mesh is not None:
            loss = ((out - s["target"]) ** 2).mean()  # global: a ShardTensor reduction
            loss.backward()
            value = loss.detach().full_tensor().double().reshape(1)  # Partial: summed here
        else:
            n = torch.tensor([float(out.numel())], dtype=torch.float64, device=out.device)
            if sharded:
                dist.all_reduce(n, group=group)
            loss = ((out - s["target"]) ** 2).sum() / float(n)
            loss.backward()
            value = loss.detach().double().reshape(1)
            if sharded:
                allreduce_grads(model, group)
                dist.all_reduce(value, group=group)
        opt.step()
        losses.append(float(value))
        log.info("step %d/%d  loss %.6f", step + 1, steps, losses[-1])
    return losses


def _as_shardtensors(sample: dict, mesh) -> dict:
    """The sample's pieces as ShardTensors on ``mesh``: rows ``[Shard(0)]`` (sizes from one
    all-gather each), the grid in the layout's slabs or replicated. Collective."""
    lay = sample["layout"]
    out = dict(sample)
    for key in ("stl", "points", "normals", "target"):
        out[key] = from_local(sample[key], mesh, [Shard(0)])
    if lay.sizes is None:
        out["sdf"] = from_local(sample["sdf"], mesh, [Replicate()])
    else:
        out["sdf"] = from_local(sample["sdf"], mesh, [Shard(lay.axis)], [list(lay.sizes)])
    return out


def compare_curves(sharded: list[float], single: list[float], png: Path | None) -> float:
    """Largest relative difference of two loss curves; plots both (and it) to ``png``."""
    rel = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(sharded, single)]
    if png is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        steps = range(1, len(single) + 1)
        a1.plot(steps, single, label="one process", lw=3, alpha=0.5)
        a1.plot(steps, sharded, "--", label="domain-parallel")
        a1.set(xlabel="step", ylabel="loss (standardised MSE)", yscale="log",
               title="DoMINO loss")
        a1.legend()
        nonzero = [(i, r) for i, r in zip(steps, rel) if r > 0]
        equal = [i for i, r in zip(steps, rel) if r == 0]
        floor = min(r for _, r in nonzero) / 10 if nonzero else 1e-18
        if nonzero:
            a2.plot(*zip(*nonzero), "o-", ms=3, label="relative difference")
        if equal:  # a log axis has no 0: mark bit-equal steps below the smallest difference
            a2.plot(equal, [floor] * len(equal), "v", color="tab:green", label="equal (0)")
        a2.set_yscale("log")
        a2.legend()
        a2.set(xlabel="step", ylabel="|sharded - single| / single",
               title=f"largest relative difference {max(rel):.2e}")
        fig.tight_layout()
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=100)
        plt.close(fig)
    return max(rel) if rel else 0.0
