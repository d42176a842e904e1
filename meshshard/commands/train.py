"""`meshshard train STORES --checkpoint CKPT`: the reference Transolver (or DoMINO) on
preprocessed run stores, domain-parallel under torchrun, one process without it.

    meshshard train STORES --steps 200 --checkpoint ckpt/transolver
    torchrun --standalone --nproc-per-node 2 -m meshshard train STORES --checkpoint ckpt/t
    torchrun --standalone --nproc-per-node 4 -m meshshard train STORES --data-parallel 2 \\
        --data-parallel-mode fsdp --resume --checkpoint ckpt/t

The options and their checks; the work is :mod:`meshshard.commands.handlers.train` over
:func:`meshshard.apps.train_runs.train_main`, which ends by writing the model
checkpoint (``--model-out``, default ``<checkpoint>-model``) that ``predict`` and ``evaluate``
read.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from meshshard.commands import CLIError
from meshshard.commands._checks import check_at_least


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stores", type=Path,
                        help="directory of run_<i>.zarr stores (from meshshard preprocess)")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/transolver"),
                        help="training checkpoint directory (torch.distributed.checkpoint; "
                             "default %(default)s)")
    parser.add_argument("--model-out", type=Path, default=None,
                        help="model checkpoint for meshshard predict/evaluate, written at the "
                             "end (default: <checkpoint>-model)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (%(default)s)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    parser.add_argument("--knn", type=int, default=8, help="neighbours of the kNN features")
    parser.add_argument("--hidden", type=int, default=64, help="model width")
    parser.add_argument("--layers", type=int, default=4, help="Transolver layers")
    parser.add_argument("--slices", type=int, default=32, help="Transolver slices")
    parser.add_argument("--val-fraction", type=float, default=0.2,
                        help="share of the runs held out for validation (at least one, never "
                             "all; with one run there is none, and that is said; 0: no "
                             "validation; default %(default)s)")
    parser.add_argument("--checkpoint-every", type=int, default=50,
                        help="save the training checkpoint every N steps (and at the end)")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--part", choices=("surface", "volume"), default="surface",
                        help="train on the surface cells (kNN features) or on the volume cells "
                             "(signed distance to the STL; stores preprocessed with the volume)")
    parser.add_argument("--data-parallel", type=int, default=1, help="size of the data axis")
    parser.add_argument("--data-parallel-mode", choices=("ddp", "fsdp"), default="ddp",
                        help="DDP (replicated state) or FSDP2 (state sharded over data x "
                             "domain)")
    parser.add_argument("--tensor-parallel", type=int, default=1,
                        help="size of the tensor axis (Megatron linears; world = data x domain "
                             "x tensor)")
    parser.add_argument("--model", choices=("transolver", "domino"), default="transolver",
                        help="domino: DoMINO with a sharded latent grid and SDF (docs/domino.md)")
    parser.add_argument("--grid", type=int, nargs=3, default=(16, 8, 8), metavar=("D", "H", "W"),
                        help="DoMINO latent grid (the recipe: 128 64 64)")
    parser.add_argument("--grid-layout", choices=("slab", "replicated"), default="slab",
                        help="DoMINO: cut the grid in slabs along D over the ranks, or "
                             "replicate it")
    parser.add_argument("--compare-single", action="store_true",
                        help="DoMINO: also train one process on rank 0 and compare the loss "
                             "curves")
    parser.add_argument("--float64", action="store_true",
                        help="DoMINO: train in float64 (separates rounding from real "
                             "differences)")
    parser.add_argument("--device", default=None,
                        help="cuda or cpu (default: cuda when present; each rank takes its "
                             "LOCAL_RANK GPU)")
    parser.add_argument("--png", type=Path, default=Path("domino_loss.png"),
                        help="DoMINO: plot of both loss curves (with --compare-single)")


def check_args(args: argparse.Namespace) -> None:
    """Every option a rank can refuse alone, before any process group or file is touched."""
    for flag, value in (("--steps", args.steps), ("--knn", args.knn), ("--hidden", args.hidden),
                        ("--layers", args.layers), ("--slices", args.slices),
                        ("--checkpoint-every", args.checkpoint_every),
                        ("--data-parallel", args.data_parallel),
                        ("--tensor-parallel", args.tensor_parallel)):
        check_at_least(flag, value, 1)
    if not args.lr > 0:
        msg = f"--lr {args.lr} must be > 0"
        raise CLIError(msg)
    if not 0 <= args.val_fraction < 1:
        msg = f"--val-fraction {args.val_fraction} must be >= 0 and < 1"
        raise CLIError(msg)
    if min(args.grid) < 2:
        msg = f"--grid {' '.join(map(str, args.grid))}: every size must be >= 2"
        raise CLIError(msg)
    if not args.stores.is_dir():
        msg = (f"{args.stores}: no such directory; give the DST of `meshshard preprocess "
               "drivaerml RAW DST`")
        raise CLIError(msg)
    if not any(p.is_dir() for p in args.stores.glob("run_*.zarr")):
        msg = (f"{args.stores}: no run_<i>.zarr stores; make them with `meshshard preprocess "
               f"drivaerml RAW {args.stores} --parts P`")
        raise CLIError(msg)

