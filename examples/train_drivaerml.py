"""Train the reference Transolver on preprocessed DrivaerML stores, domain-parallel, under torchrun.

Each sample (one car) is split over the ``domain`` ranks (ShardTensors from
``meshshard.pipelines.load_shard``); with ``--data-parallel D`` the world is a 2-D mesh
(data x domain): each data-parallel group trains on its own runs and gradients are averaged
over the ``data`` axis. Checkpoints are written atomically and resumed with ``weights_only``
loading; a validation pass reports relative L2 errors of pressure and wall shear stress.

    meshshard preprocess drivaerml RAW STORES --parts 4 --surface
    torchrun --standalone --nproc-per-node 2 examples/train_drivaerml.py STORES \
        --steps 200 --checkpoint ckpt/transolver.pt
    torchrun --standalone --nproc-per-node 4 examples/train_drivaerml.py STORES \
        --data-parallel 2 --resume --checkpoint ckpt/transolver.pt

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
from torch.distributed.tensor import DTensor

from meshshard.distributed import check_collective, init, shutdown
from meshshard.parallel.plans import transolver_plan
from meshshard.parallel.tensor import parallelize_module
from meshshard.train import (
    TrainConfig,
    load_checkpoint,
    load_sample,
    make_model,
    relative_l2,
    save_checkpoint,
)

log = logging.getLogger("train_drivaerml")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", type=Path, help="directory of run_<i>.zarr stores")
    ap.add_argument("--data-parallel", type=int, default=1, help="size of the data axis")
    ap.add_argument("--tensor-parallel", type=int, default=1,
                    help="size of the tensor axis (Megatron linears; world = data x domain x "
                         "tensor)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--knn", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--slices", type=int, default=32)
    ap.add_argument("--val-fraction", type=float, default=0.2, help="runs held out")
    ap.add_argument("--checkpoint", type=Path, default=Path("checkpoints/transolver.pt"))
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    return ap.parse_args(argv)


def setup() -> tuple[int, int]:
    # under torchrun: join it; plain `python train_drivaerml.py`: a world of one. Collectives
    # fail after MESHSHARD_TIMEOUT seconds (default 5 minutes) instead of hanging
    return init()


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world = setup()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s %(message)s")
    dp, tp = args.data_parallel, args.tensor_parallel
    if dp < 1 or tp < 1 or world % (dp * tp):
        msg = f"--data-parallel {dp} x --tensor-parallel {tp} must divide the world size {world}"
        raise SystemExit(msg)
    domain = world // (dp * tp)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    mesh = init_device_mesh(device_type, (dp, domain, tp),
                            mesh_dim_names=("data", "domain", "tensor"))
    dmesh = mesh["domain"]
    d_rank = dmesh.get_local_rank()
    data_rank = mesh.get_local_rank("data")
    runs = sorted(p for p in args.stores.glob("run_*.zarr") if p.is_dir())
    if not runs:
        msg = f"{args.stores}: no run_<i>.zarr stores (run meshshard preprocess first)"
        raise SystemExit(msg)
    n_val = max(1, round(len(runs) * args.val_fraction)) if len(runs) > 1 else 0
    train_runs, val_runs = runs[n_val:] or runs, runs[:n_val]
    cfg = TrainConfig(steps=args.steps, lr=args.lr, knn=args.knn, n_hidden=args.hidden,
                      n_layers=args.layers, slices=args.slices)

    cache: dict[Path, dict] = {}

    def sample(path: Path) -> dict:
        if path not in cache:  # loading builds kNN features: collective over the domain group
            cache[path] = load_sample(path, d_rank, domain, dmesh, knn=cfg.knn,
                                      standardise_target=False)
        return cache[path]

    first = sample(train_runs[0])
    model = make_model(cfg, first["features"].shape[-1], first["target"].shape[-1])
    model.to(device_type)
    if tp > 1:  # Megatron linears over "tensor"; samples stay ShardTensors on mesh["domain"]
        parallelize_module(model, mesh["domain", "tensor"], transolver_plan(model))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    start = 0
    # per-channel target scaling from the first training run (global over its points); kept
    # in the checkpoint so a resumed or validating job uses the same units
    with torch.no_grad():
        t = first["target"]
        scale = {"mean": t.mean(dim=(0, 1)).full_tensor().cpu(),
                 "std": t.std(dim=(0, 1)).full_tensor().cpu() + 1e-12}
    if args.resume and args.checkpoint.exists():
        ck = load_checkpoint(args.checkpoint)  # weights_only; corrupt -> ValueError
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start = ck["step"]
        scale = {k: torch.as_tensor(v) for k, v in ck["extra"]["target_scale"].items()}
        log.info("resumed from %s at step %d", args.checkpoint, start)
    mu, sigma = (scale[k].to(first["target"].device) for k in ("mean", "std"))
    data_group = mesh.get_group("data")
    for step in range(start, cfg.steps):
        run = train_runs[(step * dp + data_rank) % len(train_runs)]
        s = sample(run)
        opt.zero_grad(set_to_none=True)
        loss = ((model(s["coords"], s["features"]) - (s["target"] - mu) / sigma) ** 2).mean()
        loss.backward()  # weight grads are exact over the domain group
        if dp > 1:  # average over the data axis, like DDP
            for p in model.parameters():
                if p.grad is not None:
                    g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad  # TP piece
                    check_collective("all_reduce", data_group, g, detail="sum: grads")
                    dist.all_reduce(g, group=data_group)
                    g /= dp
        opt.step()
        value = loss.item()
        if rank == 0:
            log.info("step %d/%d  run %s  loss %.5f", step + 1, cfg.steps, run.stem, value)
        if rank == 0 and ((step + 1) % args.checkpoint_every == 0 or step + 1 == cfg.steps):
            save_checkpoint(args.checkpoint, model, opt, step + 1, cfg,
                            extra={"target_scale": {k: v.tolist() for k, v in scale.items()}})
        check_collective("barrier", detail="after the checkpoint")  # debug mode only
        dist.barrier()
    if val_runs:
        errs = []
        with torch.no_grad():
            for run in val_runs[data_rank::dp]:
                s = sample(run)
                pred = model(s["coords"], s["features"]) * sigma + mu  # physical units
                errs.append((relative_l2(pred, s["target"], slice(0, 1)),
                             relative_l2(pred, s["target"], slice(1, 4))))
        if rank == 0 and errs:
            p = sum(e[0] for e in errs) / len(errs)
            w = sum(e[1] for e in errs) / len(errs)
            log.info("validation (%d runs on data rank 0): relative L2 pressure %.4f, "
                     "wall shear stress %.4f", len(errs), p, w)
    shutdown()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except (ValueError, FileNotFoundError) as exc:  # bad store, world size, checkpoint
        print(f"train_drivaerml: error: {exc}", file=sys.stderr)
        sys.exit(2)
    shutdown(exit_code=code)  # main tore the groups down; skip the interpreter teardown
