"""ShardTensor cost and benefit on the reference Transolver (forward + backward, one step).

1. Dispatch overhead: ShardTensor on a 1-rank process group vs plain torch, same process,
   same threads, at 1k / 100k / 1M points.
2. Scaling: 2 gloo ranks (1 thread each, uneven 45/55 split) vs 1 process (1 thread).
3. Memory: per-rank saved activations and peak RSS growth, 2 even ranks vs 1 process, at the
   largest N (see bench_memory.py).

    python benchmarks/bench_shardtensor.py                 # 1k, 100k, 1M points
    python benchmarks/bench_shardtensor.py --points 1000,100000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from meshshard.testing import run_ranks

MODEL = dict(space_dim=3, fun_dim=2, out_dim=2, n_hidden=32, n_layers=2, heads=2, slices=16)


def _data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, n, 3, generator=g), torch.randn(1, n, 2, generator=g),
            torch.randn(1, n, 2, generator=g))


def _step(model, c, f, t):
    model.zero_grad(set_to_none=True)
    loss = ((model(c, f) - t) ** 2).mean()
    loss.backward()
    return loss


def _time(fn, repeats):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def overhead_rank(rank, world_size, n, repeats, threads):
    """Plain torch vs ShardTensor (1-rank group) in the same process."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.shardtensor import Shard, from_local

    torch.set_num_threads(threads)
    mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    model = Transolver(**MODEL)
    c, f, t = _data(n)
    plain = _time(lambda: _step(model, c, f, t), repeats)
    sc, sf, st = (from_local(a, mesh, [Shard(1)], [n]) for a in (c, f, t))
    sharded = _time(lambda: _step(model, sc, sf, st), repeats)
    return plain, sharded


def scaling_rank(rank, world_size, n, repeats):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    model = Transolver(**MODEL)
    if world_size == 1:
        sizes = [n]
    else:
        first = int(n * 0.45)
        sizes = [first, n - first]  # deliberately uneven
    c, f, t = _data(n)
    off = sum(sizes[:rank])
    sl = slice(off, off + sizes[rank])
    parts = [a[:, sl].clone() for a in (c, f, t)]
    del c, f, t
    sc, sf, st = (from_local(a, mesh, [Shard(1)], sizes) for a in parts)
    return {"time": _time(lambda: _step(model, sc, sf, st), repeats)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="1000,100000,1000000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    sizes = [int(float(s)) for s in args.points.split(",")]
    print(f"# ShardTensor benchmark: Transolver {MODEL}, fwd+bwd, best of {args.repeats}")
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, {args.threads} thread(s)/process")
    print()
    print("| points | plain torch (s) | ShardTensor 1 rank (s) | overhead | per layer (ms) |")
    print("|---:|---:|---:|---:|---:|")
    for n in sizes:
        plain, sharded = run_ranks(overhead_rank, 1, n, args.repeats, args.threads,
                                   timeout=3600)[0]
        over = sharded / plain - 1
        per_layer = (sharded - plain) / MODEL["n_layers"] * 1e3
        print(f"| {n:,} | {plain:.4f} | {sharded:.4f} | {over:+.1%} | {per_layer:+.2f} |",
              flush=True)
    print()
    print("| points | 1 process (s) | 2 ranks (s) | speed-up |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        one = run_ranks(scaling_rank, 1, n, args.repeats, timeout=3600)[0]["time"]
        two = max(r["time"] for r in run_ranks(scaling_rank, 2, n, args.repeats,
                                               timeout=3600))
        print(f"| {n:,} | {one:.3f} | {two:.3f} | {one / two:.2f}x |", flush=True)
    n = sizes[-1]
    from bench_memory import step_memory

    one = run_ranks(step_memory, 1, n, timeout=3600)[0]
    two = run_ranks(step_memory, 2, n, timeout=3600)
    print()
    print(f"Memory of one step at {n:,} points, 2 even ranks vs 1 process (per process):")
    print("| layout | rank | saved activations (MB) | ratio | peak RSS growth (MB) | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| 1 process | 0 | {one['act_mb']:.0f} | 1.00 | {one['rss_mb']:.0f} | 1.00 |")
    for r, rep in enumerate(two):
        print(f"| 2 ranks | {r} | {rep['act_mb']:.0f} | {rep['act_mb'] / one['act_mb']:.2f} | "
              f"{rep['rss_mb']:.0f} | {rep['rss_mb'] / one['rss_mb']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
