"""Per-rank memory of one Transolver training step at 1M points with 1, 2 and 4 ranks.

Two measures per rank, as ratios to 1 rank:

- *activations*: bytes of the tensors autograd saves for backward during the forward pass
  (exact, counted once per storage with ``torch.autograd.graph.saved_tensors_hooks``);
- *RSS growth*: peak resident memory during the step minus the resident memory before it
  (includes temporaries, allocator slack and communication buffers).

Target: per-rank activation memory falls as 1/P within 15%.

    python benchmarks/bench_memory.py                    # 1M points, 1/2/4 ranks
    python benchmarks/bench_memory.py --points 200000 --ranks 1,2
"""

from __future__ import annotations

import argparse

import torch

from meshshard.testing import run_ranks
from meshshard.testing.memory import peak_rss_bytes, rss_bytes
from meshshard.testing.memory import saved_activation_bytes as activation_bytes

MODEL = dict(space_dim=3, fun_dim=2, out_dim=2, n_hidden=32, n_layers=2, heads=2, slices=16)


def step_memory(rank, world_size, n):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.shardtensor import Shard, even_sizes, from_local

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    model = Transolver(**MODEL)
    sizes = even_sizes(n, world_size)
    m = sizes[rank]
    g = torch.Generator().manual_seed(rank)
    c, f, t = (from_local(torch.randn(1, m, d, generator=g), mesh, [Shard(1)], sizes)
               for d in (3, 2, 2))
    base = rss_bytes() / 2**20
    pred, act = activation_bytes(lambda: model(c, f))
    loss = ((pred - t) ** 2).mean()
    loss.backward()
    peak = peak_rss_bytes() / 2**20
    return {"rows": m, "act_mb": act / 2**20, "rss_mb": peak - base}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=float, default=1e6)
    ap.add_argument("--ranks", default="1,2,4")
    args = ap.parse_args(argv)
    n = int(args.points)
    counts = [int(r) for r in args.ranks.split(",")]
    print(f"# one training step of Transolver {MODEL} at {n:,} points (even shards)")
    print()
    print("| ranks | rows/rank | activations/rank (MB) | ratio | ideal 1/P | within 15% | "
          "RSS growth/rank (MB) | ratio |")
    print("|---:|---:|---:|---:|---:|:---:|---:|---:|")
    base = None
    for p in counts:
        reps = run_ranks(step_memory, p, n, timeout=3600)
        act = max(r["act_mb"] for r in reps)
        rss = max(r["rss_mb"] for r in reps)
        if base is None:
            base = (act, rss)
        ra, rr = act / base[0], rss / base[1]
        ok = "yes" if ra <= (1 / p) * 1.15 else "no"
        print(f"| {p} | {reps[0]['rows']:,} | {act:,.0f} | {ra:.3f} | {1 / p:.3f} | {ok} | "
              f"{rss:,.0f} | {rr:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
