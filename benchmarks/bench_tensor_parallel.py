"""Tensor parallelism beside domain parallelism: one Transolver training step on 4 ranks laid
out as domain x tensor = 4x1, 2x2 and 1x4 (``meshshard.parallel.tensor`` with the Transolver
plan).

Per rank: parameter elements held, bytes autograd saves for backward (activations), and the
median forward+backward time. Also checks that every layout gives the same loss.

    python benchmarks/bench_tensor_parallel.py                       # 20k points, hidden 256
    python benchmarks/bench_tensor_parallel.py --points 200000 --hidden 512 --heads 8

Timings need a quiet machine (ranks run with one thread each).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from meshshard.testing import run_ranks
from meshshard.testing.memory import saved_activation_bytes as _saved_bytes


def step(rank, world_size, layout, n, model_kw, repeat):
    from meshshard.models import Transolver
    from meshshard.parallel.plans import transolver_plan
    from meshshard.parallel.tensor import init_mesh_3d, parallelize_module
    from meshshard.shardtensor import Shard, from_local

    domain, tensor = layout
    mesh = init_mesh_3d(1, domain, tensor, device_type="cpu")
    torch.manual_seed(0)
    model = Transolver(**model_kw)
    if tensor > 1:
        parallelize_module(model, mesh, transolver_plan(model))
    params = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters()
    )
    sizes = [n // domain + (r < n % domain) for r in range(domain)]
    pc = mesh.get_local_rank("domain")
    g = torch.Generator().manual_seed(1)
    full = torch.randn(1, n, model_kw["space_dim"] + model_kw["fun_dim"] + 2, generator=g)
    off = sum(sizes[:pc])
    local = full[:, off : off + sizes[pc]]
    dmesh = mesh["domain"]
    x, t = (from_local(a.contiguous(), dmesh, [Shard(1)], sizes)
            for a in (local[..., :3], local[..., 3:]))
    c, f = x, t[..., : model_kw["fun_dim"]]
    target = t[..., model_kw["fun_dim"]:]

    def fwd():
        return ((model(c, f) - target) ** 2).mean()

    loss, saved = _saved_bytes(fwd)
    loss.backward()
    times = []
    for _ in range(repeat):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        fwd().backward()
        times.append(time.perf_counter() - t0)
    return {"params": params, "saved": saved, "time": statistics.median(times),
            "loss": float(loss.item())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=float, default=2e4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--slices", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    n = int(args.points)
    kw = dict(space_dim=3, fun_dim=2, out_dim=2, n_hidden=args.hidden, n_layers=args.layers,
              heads=args.heads, slices=args.slices)
    print(f"Transolver hidden {args.hidden}, {args.layers} layers, {args.heads} heads, "
          f"{n} points, 4 ranks")
    print(f"{'domain x tensor':>16} {'params/rank':>12} {'saved MB/rank':>14} "
          f"{'step s':>8} {'loss':>12}")
    for layout in ((4, 1), (2, 2), (1, 4)):
        if args.heads % layout[1]:
            continue
        reps = run_ranks(step, 4, layout, n, kw, args.repeat, timeout=1800)
        params = max(r["params"] for r in reps)
        saved = max(r["saved"] for r in reps) / 2**20
        t = max(r["time"] for r in reps)
        print(f"{layout[0]:>9} x {layout[1]:<4} {params:>12,} {saved:>14.1f} {t:>8.3f} "
              f"{reps[0]['loss']:>12.7f}")


if __name__ == "__main__":
    main()
