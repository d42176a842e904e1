"""Training over preprocessed run stores, domain-parallel: the app behind ``meshshard train``.

Each sample (one car) is split over the ``domain`` ranks (ShardTensors from
:func:`meshshard.datasets.load_shard`); with ``--data-parallel D`` the world is a 2-D mesh
(data x domain): each data-parallel group trains on its own runs and gradients are averaged
over the ``data`` axis by DDP (``--data-parallel-mode ddp``) or FSDP2 (``fsdp``: parameters,
gradients and Adam state sharded over data x domain); ``--tensor-parallel T`` adds a third
axis (Megatron linears). Checkpoints are distributed (``torch.distributed.checkpoint``, one
directory, written atomically) and can be resumed on another mesh shape or mode; a validation
pass reports relative L2 errors. At the end it writes the model checkpoint that
``meshshard predict`` and ``meshshard evaluate`` read. ``--model domino`` trains DoMINO
(:mod:`meshshard.apps.domino_train`).

The per-step building blocks (features, the model, the loss) are in :mod:`meshshard.apps.train`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from meshshard.apps.domino_train import compare_curves, domino_sample, make_domino, train_domino
from meshshard.apps.export import export_surface_model
from meshshard.apps.train import TrainConfig, load_sample, make_model, relative_l2, split_runs
from meshshard.apps.volume import export_volume_model, load_volume_sample
from meshshard.comm import check_collective, default_device, init, shutdown
from meshshard.errors import InputError
from meshshard.models.domino import LocalOps
from meshshard.ops.domino_ops import ShardedDominoOps
from meshshard.parallel import data_parallel, load_checkpoint, save_checkpoint
from meshshard.parallel.plans import transolver_plan
from meshshard.parallel.tensor import init_mesh_3d, parallelize_module

log = logging.getLogger(__name__)

__all__ = ["train_main"]


def _log_on_rank_zero(rank: int) -> None:
    """Steps, checkpoints and validation at INFO on rank 0 (unless logging is set lower, as
    ``--debug`` does); the other ranks say only warnings."""
    root = logging.getLogger()
    if not root.handlers:  # called from Python without a configured logging
        logging.basicConfig(format="%(asctime)s %(message)s")
    if rank == 0:
        log.setLevel(min(logging.INFO, root.getEffectiveLevel()))
    else:
        log.setLevel(logging.WARNING)


def run_device(args: argparse.Namespace) -> torch.device:
    """``--device``, else this rank's GPU when CUDA is present, else the CPU."""
    if args.device is None:
        return default_device()
    dev = torch.device(args.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def train_main(args: argparse.Namespace) -> int:
    """Train as ``meshshard train`` asks (the namespace of
    :func:`meshshard.commands.train.add_args`); returns the exit code.

    Collective: under torchrun every rank calls this (it joins the group itself); alone, it
    makes a world of one. The groups are torn down before it returns.
    """
    split_runs([], args.val_fraction)  # a bad --val-fraction: refused before any group is made
    # under torchrun: join it; alone: a world of one. Collectives fail after MESHSHARD_TIMEOUT
    # seconds (default 5 minutes). On CUDA the group is cpu:gloo,cuda:nccl (the CPU tensors a
    # loader still moves go through gloo)
    rank, world = init("gloo" if args.device == "cpu" else None)
    _log_on_rank_zero(rank)
    if args.model == "domino":
        return train_domino_main(args, rank, world)
    dp, tp = args.data_parallel, args.tensor_parallel
    if dp < 1 or tp < 1 or world % (dp * tp):
        msg = f"--data-parallel {dp} x --tensor-parallel {tp} must divide the world size {world}"
        raise InputError(msg)
    domain = world // (dp * tp)
    device_type = run_device(args).type
    if tp > 1:
        mesh = init_mesh_3d(dp, domain, tp, device_type=device_type)
    else:
        mesh = init_device_mesh(device_type, (dp, domain), mesh_dim_names=("data", "domain"))
    dmesh = mesh["domain"]
    d_rank = dmesh.get_local_rank()
    data_rank = mesh.get_local_rank("data")
    runs = sorted(p for p in args.stores.glob("run_*.zarr") if p.is_dir())
    if not runs:
        msg = f"{args.stores}: no run_<i>.zarr stores (run meshshard preprocess first)"
        raise InputError(msg)
    train_runs, val_runs, note = split_runs(runs, args.val_fraction)
    if rank == 0:
        if note:
            log.warning("WARNING: %s: %s", args.stores, note)
        else:
            log.info("%d training run(s), %d held out for validation", len(train_runs),
                     len(val_runs))
    cfg = TrainConfig(steps=args.steps, lr=args.lr, knn=args.knn, n_hidden=args.hidden,
                      n_layers=args.layers, slices=args.slices)

    cache: dict[Path, dict] = {}

    def sample(path: Path) -> dict:
        if path not in cache:  # loading builds the features: collective over the domain group
            if args.part == "volume":
                cache[path] = load_volume_sample(path, dmesh)
            else:
                cache[path] = load_sample(path, d_rank, domain, dmesh, knn=cfg.knn,
                                          standardise_target=False)
        return cache[path]

    first = sample(train_runs[0])
    model = make_model(cfg, first["features"].shape[-1], first["target"].shape[-1])
    model.to(device_type)
    if tp > 1:  # Megatron linears over "tensor"; samples stay ShardTensors on mesh["domain"]
        parallelize_module(model, mesh["domain", "tensor"], transolver_plan(model))
    model = data_parallel(model, mesh, mode=args.data_parallel_mode)  # collective
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    start = 0
    # per-channel target scaling from the first training run (global over its points); kept
    # in the checkpoint so a resumed or validating job uses the same units
    with torch.no_grad():
        t = first["target"]
        scale = {"mean": t.mean(dim=(0, 1)).full_tensor().cpu(),
                 "std": t.std(dim=(0, 1)).full_tensor().cpu() + 1e-12}
    old = args.checkpoint.with_name(args.checkpoint.name + ".old")  # an interrupted commit
    if args.resume and (args.checkpoint.exists() or old.exists()):
        # collective; any mesh shape or mode; foreign/other model -> CheckpointError (ValueError)
        ck = load_checkpoint(args.checkpoint, model, opt)
        start = ck["step"]
        scale = {k: torch.as_tensor(v) for k, v in ck["extra"]["target_scale"].items()}
        log.info("resumed from %s at step %d", args.checkpoint, start)
    elif args.resume and rank == 0:  # never start again at step 1 without saying so
        log.warning("--resume: no checkpoint at %s (nor %s): starting at step 1",
                    args.checkpoint, old.name)  # fmt: skip
    mu, sigma = (scale[k].to(first["target"].device) for k in ("mean", "std"))
    for step in range(start, cfg.steps):
        run = train_runs[(step * dp + data_rank) % len(train_runs)]
        s = sample(run)
        opt.zero_grad(set_to_none=True)
        loss = ((model(s["coords"], s["features"]) - (s["target"] - mu) / sigma) ** 2).mean()
        loss.backward()  # exact over the domain group; DDP / FSDP2 average over data
        opt.step()
        value = loss.item()
        if rank == 0:
            log.info("step %d/%d  run %s  loss %.5f", step + 1, cfg.steps, run.stem, value)
        if (step + 1) % args.checkpoint_every == 0 or step + 1 == cfg.steps:
            saved = save_checkpoint(args.checkpoint, model, opt, step=step + 1,  # collective
                                    extra={"target_scale": {k: v.tolist()
                                                            for k, v in scale.items()},
                                           "config": vars(cfg)})  # fmt: skip
            if rank == 0:
                log.info("saved checkpoint %s at step %d", saved, step + 1)
        check_collective("barrier", detail="after the checkpoint")  # debug mode only
        dist.barrier()
    # the model with its class, config, field names and scales: what `meshshard predict` reads
    model_out = args.model_out or args.checkpoint.with_name(args.checkpoint.name + "-model")
    config = cfg.model_kwargs(first["features"].shape[-1], first["target"].shape[-1])
    extra = {"steps": cfg.steps, "runs": len(train_runs)}
    if args.part == "volume":  # inputs.part = "volume": predict reads the .vtu's cells
        export_volume_model(model_out, model, model_config=config, rows=first["rows"],
                            target_mean=scale["mean"].tolist(),
                            target_std=scale["std"].tolist(), extra=extra)
    else:
        export_surface_model(  # collective (the full state dict is gathered); rank 0 writes
            model_out, model, model_config=config, knn=cfg.knn, store=train_runs[0],
            target_mean=scale["mean"].tolist(), target_std=scale["std"].tolist(), extra=extra)
    if rank == 0:
        log.info("model checkpoint for meshshard predict: %s", model_out)
    if args.part == "volume":
        columns = first["rows"].columns
    else:
        columns = {"pressure": (0, 1), "wall shear stress": (1, 4)}
    if val_runs:
        errs = []
        with torch.no_grad():
            # every data rank runs the same number of forwards: FSDP2's forward all-gathers
            # the parameters over data x domain (a rank out of runs repeats one, unrecorded)
            for i in range(-(-len(val_runs) // dp)):
                j = i * dp + data_rank
                s = sample(val_runs[j % len(val_runs)])
                pred = model(s["coords"], s["features"]) * sigma + mu  # physical units
                if j < len(val_runs):
                    errs.append({n: relative_l2(pred, s["target"], slice(a, b))
                                 for n, (a, b) in columns.items()})
        if rank == 0 and errs:
            mean = ", ".join(f"{n} {sum(e[n] for e in errs) / len(errs):.4f}" for n in columns)
            log.info("validation (%d runs on data rank 0): relative L2 %s", len(errs), mean)
    shutdown()
    return 0


def _double(sample: dict) -> dict:
    return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in sample.items()}


def train_domino_main(args, rank: int, world: int) -> int:
    """DoMINO, domain-parallel over all ranks; optionally the same training on one process."""
    runs = sorted(p for p in args.stores.glob("run_*.zarr") if p.is_dir())
    if not runs:
        msg = f"{args.stores}: no run_<i>.zarr stores (run meshshard preprocess first)"
        raise InputError(msg)
    device = run_device(args)
    mesh = init_device_mesh(device.type, (world,))
    group = mesh.get_group(0)
    solo = dist.new_group([0])  # collective: the one-process reference's group
    samples = [domino_sample(r, rank, world, group, grid_shape=args.grid,
                             grid_layout=args.grid_layout, device=device) for r in runs]
    lay = samples[0]["layout"]
    ops = ShardedDominoOps(mesh, lay.sizes, validate=False)  # domino_sample checked the points
    model = make_domino(lay, samples[0]["target"].shape[1], ops, hidden=args.hidden,
                        device=device)
    if args.float64:
        model, samples = model.double(), [_double(s) for s in samples]
    # ShardTensor inputs: a plain loss.backward() gives global gradients (no allreduce_grads)
    losses = train_domino(samples, model, steps=args.steps, lr=args.lr, mesh=mesh)
    if args.compare_single:
        if rank == 0:
            ref = [domino_sample(r, 0, 1, solo, grid_shape=args.grid, device=device)
                   for r in runs]
            single = make_domino(ref[0]["layout"], ref[0]["target"].shape[1], LocalOps(),
                                 hidden=args.hidden, device=device)
            if args.float64:
                single, ref = single.double(), [_double(s) for s in ref]
            base = train_domino(ref, single, steps=args.steps, lr=args.lr, sharded=False)
            worst = compare_curves(losses, base, args.png)
            kind = "float64" if args.float64 else "float32"
            print(f"domino ({kind}): {world} ranks ({args.grid_layout} grid "
                  f"{tuple(args.grid)}) vs one process over {args.steps} steps: largest "
                  f"relative loss difference {worst:.3e}; plot: {args.png}", flush=True)
        dist.barrier()
    shutdown()
    return 0
