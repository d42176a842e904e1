"""torch.compile and ShardTensor: per-rank CPU time per step, one process vs eager vs plain
``torch.compile(model)``, on the reference Transolver (forward + backward, best of
``--repeats`` after warm-up, CPU clock).

1. Graphs and graph breaks of one compiled step on a 1-rank mesh (dynamo's counters).
2. On 2 gloo ranks (uneven 45/55 split), at ``--points`` (default 1k, 10k, 100k): per-rank CPU
   ms per step (slowest rank) for one process on all points, ShardTensor eager, eager with the
   backward inside ``bucket_weight_grads()`` (one weight-gradient sum, not one per layer), and
   ShardTensor under plain ``torch.compile(model)``; compilations counted; overhead = variant -
   one process.
   Compile time (first step minus a steady step) in brackets.
3. ``--dynamic``: 6 samples of different point counts and splits (one with an empty shard,
   one with a 1-row shard) through one compiled model (how many compilations, each sample's
   step time), with ``--dynamic-backend`` (default: inductor). Torch specialises a size of 0
   or 1, so each of those two samples adds a compilation on the rank that holds it.

The removed design (``compile_sharded``, a tracer per layout) measured +10.6 ms over one
process at 1k points and eager +24 ms; its figures are in ``docs/design/core.md``.

    python benchmarks/bench_compile.py                                  # 1k, 10k, 100k
    python benchmarks/bench_compile.py --points 1000,10000 --repeats 5 --dynamic
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from meshshard.testing import run_ranks

MODEL = dict(space_dim=3, fun_dim=2, out_dim=2, n_hidden=32, n_layers=2, heads=2, slices=16)
VARIANTS = ("one process", "eager", "eager bucketed", "torch.compile")


def _data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, n, 3, generator=g), torch.randn(1, n, 2, generator=g),
            torch.randn(1, n, 2, generator=g))


def _time(fn, repeats):
    now = time.process_time
    t0 = now()
    fn()  # warm-up (and compilation)
    first = now() - t0
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = now()
        fn()
        best = min(best, now() - t0)
    return best, max(first - best, 0.0)


def _counting(backend, calls):
    def compiler(gm, example_inputs):
        calls["n"] += 1
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)
        return gm.forward

    return compiler


def _setup(threads):
    from meshshard.testing.inductor import private_inductor_cache

    private_inductor_cache()
    torch.set_num_threads(threads)


def graphs_rank(rank, world_size, n, backend, threads):
    """Section 1: graphs and graph breaks of one compiled step on a 1-rank mesh."""
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.shardtensor import Shard, from_local

    _setup(threads)
    mesh = init_device_mesh("cpu", (1,))
    c, f, t = (from_local(a, mesh, [Shard(1)], [n]) for a in _data(n))
    torch.manual_seed(0)
    fwd = torch.compile(Transolver(**MODEL), backend=backend)
    counters.clear()
    ((fwd(c, f) - t) ** 2).mean().backward()
    reasons: dict = {}
    for reason, k in counters["graph_break"].items():
        head = reason.splitlines()[0][:80]
        reasons[head] = reasons.get(head, 0) + k
    return {"graphs": counters["stats"].get("unique_graphs", 0),
            "breaks": sum(counters["graph_break"].values()), "reasons": reasons}


def step_rank(rank, world_size, n, repeats, threads, backend):
    """Section 2: per-rank CPU seconds per step (best, compile) of every variant."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.shardtensor import Shard, bucket_weight_grads, from_local

    _setup(threads)
    mesh = init_device_mesh("cpu", (world_size,))
    first = int(n * 0.45)
    sizes = [first, n - first]
    full = _data(n)
    off = sum(sizes[:rank])
    sharded = [from_local(a[:, off : off + sizes[rank]].clone(), mesh, [Shard(1)], sizes,
                          validate=False) for a in full]
    out: dict = {}
    calls = {"n": 0}
    for name in VARIANTS:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Transolver(**MODEL)
        fwd = torch.compile(model, backend=_counting(backend, calls)) \
            if name == "torch.compile" else model
        c, f, t = full if name == "one process" else sharded

        def step(model=model, fwd=fwd, c=c, f=f, t=t, bucket=name == "eager bucketed"):
            model.zero_grad(set_to_none=True)
            with bucket_weight_grads(bucket):
                ((fwd(c, f) - t) ** 2).mean().backward()

        out[name] = _time(step, repeats)
        if name != "one process":
            out[name + " collectives"] = _collectives(step)
    out["compiles"] = calls["n"]
    return out


def _collectives(step) -> int:
    """All-reduces, all-gathers and all-to-alls of one step (gloo's events, torch profiler):
    on gloo each costs a fixed ~0.3-1 ms here, so at small sizes they are the overhead."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    names = ("c10d::allreduce_", "c10d::_allgather_base_", "c10d::allgather_",
             "c10d::alltoall_base_", "c10d::alltoall_")
    return sum(e.count for e in prof.key_averages() if e.key in names)


SAMPLES = ((900, (400, 500)), (1300, (0, 1300)), (700, (350, 350)), (1100, (800, 300)),
           (1000, (1, 999)), (1200, (600, 600)))


def dynamic_rank(rank, world_size, threads, backend):
    """Section 3: one compiled model over samples of different sizes and splits."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.shardtensor import Shard, from_local

    _setup(threads)
    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    model = Transolver(**MODEL)
    calls = {"n": 0}
    fwd = torch.compile(model, backend=_counting(backend, calls))
    rows = []
    for k, (n, sizes) in enumerate(SAMPLES):
        full = _data(n, seed=k)
        off = sum(sizes[:rank])
        # contiguous copies: a slice's stride on a size-1 dim differs per shard (a recompile)
        pieces = (a[:, off : off + sizes[rank]].clone(memory_format=torch.contiguous_format)
                  for a in full)
        c, f, t = (from_local(p, mesh, [Shard(1)], list(sizes), validate=False) for p in pieces)
        t0 = time.process_time()
        model.zero_grad(set_to_none=True)
        ((fwd(c, f) - t) ** 2).mean().backward()
        rows.append((n, sizes, time.process_time() - t0, calls["n"]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="1000,10000,100000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend")
    ap.add_argument("--dynamic", action="store_true", help="also run section 3")
    ap.add_argument("--dynamic-backend", default="inductor", help="section 3's backend")
    args = ap.parse_args(argv)
    points = [int(float(s)) for s in args.points.split(",") if s]
    print(f"# Transolver {MODEL}, fwd+bwd, best of {args.repeats}, backend {args.backend}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.threads} thread(s)/process, "
          f"load {os.getloadavg()[0]:.1f}")
    gb = run_ranks(graphs_rank, 1, points[0], args.backend, args.threads, timeout=3600)[0]
    print(f"\ntorch.compile(model), one step on a 1-rank mesh: {gb['graphs']} graphs, "
          f"{gb['breaks']} graph breaks")
    for reason, k in gb["reasons"].items():
        print(f"  {k:4d}  {reason}")
    print("\n2 gloo ranks (45/55 split), CPU ms per step, slowest rank (compile s in brackets):")
    print("| points | one process | eager | eager bucketed | torch.compile | compiles | "
          "eager overhead (ms) | bucketed overhead | torch.compile overhead | "
          "eager / torch.compile | collectives / step |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in points:
        reps = run_ranks(step_rank, 2, n, args.repeats, args.threads, args.backend,
                         timeout=3600)
        best = {k: max(r[k][0] for r in reps) for k in VARIANTS}
        comp = max(r["torch.compile"][1] for r in reps)
        one, e, eb, tc = (best[k] * 1e3 for k in VARIANTS)
        print(f"| {n:,} | {one:.1f} | {e:.1f} | {eb:.1f} | {tc:.1f} [{comp:.0f}] | "
              f"{max(r['compiles'] for r in reps)} | {e - one:+.1f} | {eb - one:+.1f} | "
              f"{tc - one:+.1f} | {e / tc:.2f}x | {reps[0]['eager collectives']} eager, "
              f"{reps[0]['eager bucketed collectives']} bucketed, "
              f"{reps[0]['torch.compile collectives']} compiled |", flush=True)
    if args.dynamic:
        rows = run_ranks(dynamic_rank, 2, args.threads, args.dynamic_backend, timeout=3600)
        print(f"\nOne compiled model ({args.dynamic_backend}), 6 samples (points, split): CPU s "
              "of the step, compilations so far (rank 0)")
        print("| sample | points | split | step s | compilations |")
        print("|---:|---:|---|---:|---:|")
        for k, (n, sizes, s, calls) in enumerate(rows[0]):
            print(f"| {k} | {n:,} | {sizes} | {s:.2f} | {calls} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
