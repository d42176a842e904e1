"""Train the reference Transolver on preprocessed DrivaerML stores, domain-parallel, under torchrun.

Each sample (one car) is split over the ``domain`` ranks (ShardTensors from
``meshshard.datasets.load_shard``); with ``--data-parallel D`` the world is a 2-D mesh
(data x domain): each data-parallel group trains on its own runs and gradients are averaged
over the ``data`` axis by DDP (``--data-parallel-mode ddp``) or FSDP2 (``fsdp``: parameters,
gradients and Adam state sharded over data x domain). Checkpoints are distributed
(``torch.distributed.checkpoint``, one directory, written atomically) and can be resumed on
another mesh shape or mode; a validation pass reports relative L2 errors of pressure and wall
shear stress.

    meshshard preprocess drivaerml RAW STORES --parts 4 --surface
    torchrun --standalone --nproc-per-node 2 examples/train_drivaerml.py STORES \
        --steps 200 --checkpoint ckpt/transolver
    torchrun --standalone --nproc-per-node 4 examples/train_drivaerml.py STORES \
        --data-parallel 2 --data-parallel-mode fsdp --resume --checkpoint ckpt/transolver
    meshshard predict ckpt/transolver-model RAW/run_1 --out predictions

``--part volume`` trains on the volume cells instead (stores preprocessed with the volume and
the STL; inputs: the signed distance to the body, :mod:`meshshard.apps.volume_inputs`;
targets ``UMeanTrim``, ``pMeanTrim``, ``nutMeanTrim``); its model checkpoint has
``inputs.part = "volume"`` and ``meshshard predict`` then writes a copy of the ``.vtu``.

At the end it also writes a model checkpoint (``--model-out``, default
``<checkpoint>-model``) that ``meshshard predict`` and ``meshshard evaluate`` read.

Without torchrun it runs as one process (world size 1).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from meshshard.apps.train import TrainConfig, load_sample, make_model, relative_l2, split_runs
from meshshard.comm import check_collective, init, shutdown
from meshshard.parallel import data_parallel, load_checkpoint, save_checkpoint
from meshshard.parallel.plans import transolver_plan
from meshshard.parallel.tensor import init_mesh_3d, parallelize_module

log = logging.getLogger("train_drivaerml")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", type=Path, help="directory of run_<i>.zarr stores")
    ap.add_argument("--data-parallel", type=int, default=1, help="size of the data axis")
    ap.add_argument("--data-parallel-mode", choices=("ddp", "fsdp"), default="ddp",
                    help="DDP (replicated state) or FSDP2 (state sharded over data x domain)")
    ap.add_argument("--tensor-parallel", type=int, default=1,
                    help="size of the tensor axis (Megatron linears; world = data x domain x "
                         "tensor)")
    ap.add_argument("--part", choices=("surface", "volume"), default="surface",
                    help="train on the surface cells (kNN features) or on the volume cells "
                         "(signed distance to the STL; stores preprocessed with the volume)")
    ap.add_argument("--model", choices=("transolver", "domino"), default="transolver",
                    help="domino: DoMINO with a sharded latent grid and SDF (see docs/domino.md)")
    ap.add_argument("--grid", type=int, nargs=3, default=(16, 8, 8), metavar=("D", "H", "W"),
                    help="DoMINO latent grid (the recipe: 128 64 64)")
    ap.add_argument("--grid-layout", choices=("slab", "replicated"), default="slab",
                    help="DoMINO: cut the grid in slabs along D over the ranks, or replicate it")
    ap.add_argument("--compare-single", action="store_true",
                    help="DoMINO: also train one process on rank 0 and compare the loss curves")
    ap.add_argument("--float64", action="store_true",
                    help="DoMINO: train in float64 (separates rounding from real differences)")
    ap.add_argument("--png", type=Path, default=Path("domino_loss.png"),
                    help="DoMINO: plot of both loss curves (with --compare-single)")
    ap.add_argument("--device", default=None,
                    help="cuda or cpu (default: cuda when present; each rank takes its "
                         "LOCAL_RANK GPU)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--knn", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--slices", type=int, default=32)
    ap.add_argument("--val-fraction", type=float, default=0.2,
                    help="share of the runs held out for validation (at least one, never all; "
                         "with one run there is none, and that is said; 0: no validation)")
    ap.add_argument("--checkpoint", type=Path, default=Path("checkpoints/transolver"),
                    help="checkpoint directory (torch.distributed.checkpoint)")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--model-out", type=Path, default=None,
                    help="model checkpoint for meshshard predict/evaluate, written at the end "
                         "(default: <checkpoint>-model)")
    return ap.parse_args(argv)


def setup(device: str | None = None) -> tuple[int, int]:
    # under torchrun: join it; plain `python train_drivaerml.py`: a world of one. Collectives
    # fail after MESHSHARD_TIMEOUT seconds (default 5 minutes) instead of hanging. On CUDA the
    # group is cpu:gloo,cuda:nccl (the CPU tensors a loader still moves go through gloo)
    return init("gloo" if device == "cpu" else None)


def run_device(args) -> torch.device:
    """``--device``, else this rank's GPU when CUDA is present, else the CPU."""
    from meshshard.comm import default_device

    if args.device is None:
        return default_device()
    dev = torch.device(args.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def main(argv=None) -> int:
    args = parse_args(argv)
    split_runs([], args.val_fraction)  # a bad --val-fraction: refused before any group is made
    rank, world = setup(args.device)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s %(message)s")
    if args.model == "domino":
        return train_domino_main(args, rank, world)
    dp, tp = args.data_parallel, args.tensor_parallel
    if dp < 1 or tp < 1 or world % (dp * tp):
        msg = f"--data-parallel {dp} x --tensor-parallel {tp} must divide the world size {world}"
        raise SystemExit(msg)
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
        raise SystemExit(msg)
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
                from meshshard.apps.volume import load_volume_sample

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
    from meshshard.apps.export import export_surface_model

    model_out = args.model_out or args.checkpoint.with_name(args.checkpoint.name + "-model")
    config = cfg.model_kwargs(first["features"].shape[-1], first["target"].shape[-1])
    extra = {"steps": cfg.steps, "runs": len(train_runs)}
    if args.part == "volume":  # inputs.part = "volume": predict reads the .vtu's cells
        from meshshard.apps.volume import export_volume_model

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
    from meshshard.apps.domino_train import (
        compare_curves,
        domino_sample,
        make_domino,
        train_domino,
    )
    from meshshard.models.domino import LocalOps
    from meshshard.ops.domino_ops import ShardedDominoOps

    runs = sorted(p for p in args.stores.glob("run_*.zarr") if p.is_dir())
    if not runs:
        msg = f"{args.stores}: no run_<i>.zarr stores (run meshshard preprocess first)"
        raise SystemExit(msg)
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


if __name__ == "__main__":
    try:
        code = main()
    except (ValueError, FileNotFoundError) as exc:  # bad store, world size, checkpoint
        print(f"train_drivaerml: error: {exc}", file=sys.stderr)
        sys.exit(2)
    shutdown(exit_code=code)  # main tore the groups down; skip the interpreter teardown
