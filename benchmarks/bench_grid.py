"""The reference 3-D UNet, one training step (forward + backward) on an S^3 grid split in even
slabs along D over 1, 2 and 4 gloo ranks (1 intra-op thread per rank), against one plain-torch
process with 1 thread.

Per configuration: median step time (wall) and CPU time per rank, per-rank memory -- bytes
saved for backward (exact, ``saved_tensors_hooks``) and peak RSS growth during the step
(sampled every 2 ms; glibc's mmap threshold fixed at 128 KiB so RSS follows live memory) --
and halo bytes per step (rows a rank sends to others, forward + backward; weight-gradient and
norm-statistic all-reduces are not counted). RSS growth is measured from the RSS just before
the step, so torch's and gloo's fixed cost is excluded alike for 1 and P processes; it agrees
with torch's peak of live allocations (``torch.profiler`` memory events) within 1%.

Targets (issue 13): per-rank peak memory <= 1.25/P of one process; 2 ranks <= 0.65x the
one-process (1 thread) step time.

    python benchmarks/bench_grid.py                         # 96^3, ranks 1,2,4
    python benchmarks/bench_grid.py --size 32 --ranks 1,2 --steps 2
    python benchmarks/bench_grid.py --slab-reference        # + plain torch per slab, no halo
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from meshshard.testing import run_ranks
from meshshard.testing.memory import PeakRss, peak_rss_bytes, rss_bytes
from meshshard.testing.memory import saved_activation_bytes as _saved_bytes

MODEL = dict(in_channels=1, out_channels=1, base=8, depth=3, norm="group")


def bench(rank, world_size, size, steps, plain):
    """One rank: ``steps`` timed fwd+bwd steps after one warm-up step."""
    from meshshard.models import UNet3d
    from meshshard.shardtensor import even_sizes
    from meshshard.shardtensor.grid import count_halo_bytes

    torch.manual_seed(0)
    model = UNet3d(**MODEL)
    sizes = even_sizes(size, world_size)
    off = sum(sizes[:rank])
    g = torch.Generator().manual_seed(1)
    full = torch.randn(1, 1, size, size, size, generator=g)
    local = full[:, :, off : off + sizes[rank]].clone()
    del full
    if plain:
        x = local
    else:
        from torch.distributed.device_mesh import init_device_mesh

        from meshshard.shardtensor import Shard, from_local

        mesh = init_device_mesh("cpu", (world_size,))
        x = from_local(local, mesh, [Shard(2)], sizes)

    def step():
        out = model(x)
        return (out * out).mean()

    def run_step():
        loss, saved = _saved_bytes(step)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return saved

    run_step()  # warm-up (plans cached, allocator warm)
    times, cpus, halo, growth = [], [], [], []
    saved = 0
    for _ in range(steps):
        base = rss_bytes() / 2**20
        t0, c0 = time.perf_counter(), time.process_time()
        with count_halo_bytes() as stats, PeakRss() as rss:
            saved = run_step()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        halo.append(stats.total)
        growth.append(rss.peak / 2**20 - base)
    peak = peak_rss_bytes() / 2**20
    return {"rows": sizes[rank], "step_s": statistics.median(times),
            "cpu_s": statistics.median(cpus), "saved_mb": saved / 2**20,
            "rss_growth_mb": max(statistics.median(growth), 0.0), "peak_rss_mb": peak,
            "halo_mb": statistics.median(halo) / 2**20}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--slab-reference", action="store_true",
                    help="also run plain torch on each rank's slab alone (no halo: not the "
                         "model's answer, a floor for what P processes can do on this machine)")
    args = ap.parse_args(argv)
    # big blocks straight from mmap, so RSS follows live memory instead of heap high-water marks
    # (set before the first rank starts; every configuration runs under the same setting)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    counts = [int(r) for r in args.ranks.split(",")]
    print(f"# UNet3d {MODEL}, one fwd+bwd step on a {args.size}^3 grid, slabs along D, "
          f"1 thread per rank, {os.cpu_count()} CPUs on this machine")
    print()
    print("| config | rows/rank | step wall (s) | step CPU/rank (s) | saved for bwd/rank (MB) "
          "| ratio | RSS growth/rank (MB) | ratio | target 1.25/P | halo MB/step/rank |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    configs = [("plain torch, 1 process", 1, True)] + [
        (f"ShardTensor, {p} rank(s)", p, False) for p in counts]
    if args.slab_reference:
        configs += [(f"plain torch on its slab only, {p} processes", p, True)
                    for p in counts if p > 1]
    t_plain = None
    for name, p, plain in configs:
        reps = run_ranks(bench, p, args.size, args.steps, plain, timeout=3600, threads=1)
        wall = max(r["step_s"] for r in reps)
        cpu = max(r["cpu_s"] for r in reps)
        saved = max(r["saved_mb"] for r in reps)
        rss = max(r["rss_growth_mb"] for r in reps)
        halo = max(r["halo_mb"] for r in reps)
        if base is None:
            base, t_plain = (saved, rss), wall
        print(f"| {name} | {reps[0]['rows']} | {wall:.2f} ({wall / t_plain:.2f}x) | {cpu:.2f} | "
              f"{saved:,.0f} | {saved / base[0]:.3f} | {rss:,.0f} | {rss / base[1]:.3f} | "
              f"{1.25 / p:.3f} | {halo:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
