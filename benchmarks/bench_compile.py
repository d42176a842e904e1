"""torch.compile and ShardTensor: dispatch overhead and step time, compiled vs eager.

The reference Transolver, forward + backward, best of ``--repeats`` after warm-up.

1. Dispatch overhead per layer at ``--overhead-points`` (default 1k) on a 1-rank mesh, all in
   one process: plain torch vs ShardTensor eager, ShardTensor + ``torch.compile(model)`` (every
   ShardTensor op is a graph break), ShardTensor + ``compile_local`` on the row-local
   blocks (the plan below), and ``compile_sharded`` (the whole model traced once per layout
   into one graph, collectives inside). Overhead = (variant - plain eager torch) / layers.
2. One pointwise MLP block (shallow and deep) per call: plain vs eager vs compile_local.
3. Step time on 2 gloo ranks (uneven 45/55 split), eager vs torch.compile vs compile_local vs
   compile_sharded, at ``--points`` (default 1k, 10k, 100k), with ratios.
4. ``--core`` (issue 22): on 2 gloo ranks (45/55), per-rank CPU time per step for one process
   on all points, today's ShardTensor eager and under ``compile_sharded`` (the baseline), and
   the aten-level ShardTensor (``meshshard.shardtensor._aten``, autograd on the wrapper) eager
   and under plain ``torch.compile(model)`` (compilations counted).
Compile time (first step minus a steady step) is reported separately. Graph breaks of
``torch.compile(model)`` are counted with ``torch._dynamo.explain``.

    python benchmarks/bench_compile.py                               # full run
    python benchmarks/bench_compile.py --points 1000,10000 --repeats 5 --clock cpu   # loaded host
    python benchmarks/bench_compile.py --core-only            # section 4 only (1k, 10k, 100k)
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from meshshard.testing import run_ranks

MODEL = dict(space_dim=3, fun_dim=2, out_dim=2, n_hidden=32, n_layers=2, heads=2, slices=16)
# row-local submodules of the reference Transolver (no model edits): the multi-op ones, and
# every row-local one (single linears and norms too, where compile_local saves no dispatch)
PLAN = ["preprocess", "blocks.*.mlp"]
PLAN_ALL = [*PLAN, "blocks.*.ln1", "blocks.*.ln2", "blocks.*.attn.in_project_*",
            "blocks.*.attn.to_out", "ln_out", "head"]
VARIANTS = ("eager", "torch.compile", "compile_local", "compile_sharded")


def _data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, n, 3, generator=g), torch.randn(1, n, 2, generator=g),
            torch.randn(1, n, 2, generator=g))


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}


def _time(fn, repeats, clock="wall"):
    now = CLOCK[clock]
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


def _variant(name, backend):
    """(model, step function) for one variant."""
    from meshshard.shardtensor.compile import compile_local_plan

    from meshshard.models import Transolver
    from meshshard.shardtensor import compile_sharded

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Transolver(**MODEL)
    fwd = model
    if name == "torch.compile":
        fwd = torch.compile(model, backend=backend)
    elif name == "compile_local":
        compile_local_plan(model, PLAN, backend=backend)
    elif name == "compile_sharded":
        compile_sharded(model, backend=backend)
    elif name == "compile_local (all row-local)":
        compile_local_plan(model, PLAN_ALL, backend=backend)
    return model, fwd


def _run_variant(name, backend, c, f, t, repeats, clock="wall"):
    model, fwd = _variant(name, backend)

    def step():
        model.zero_grad(set_to_none=True)
        loss = ((fwd(c, f) - t) ** 2).mean()
        loss.backward()

    return _time(step, repeats, clock)


def graph_breaks(backend, c, f, t):
    """Graphs, graph breaks and frames of one step of torch.compile(model) (dynamo counters;
    torch._dynamo.explain reports nothing here because no graph holds an op)."""
    from torch._dynamo.utils import counters

    model, fwd = _variant("torch.compile", backend)
    counters.clear()
    ((fwd(c, f) - t) ** 2).mean().backward()
    reasons = {}
    for reason, k in counters["graph_break"].items():
        head = reason.splitlines()[0][:60]
        reasons[head] = reasons.get(head, 0) + k
    return {"graphs": counters["stats"].get("unique_graphs", 0),
            "breaks": sum(counters["graph_break"].values()),
            "frames": dict(counters["frames"]), "reasons": reasons}


def overhead_rank(rank, world_size, n, repeats, threads, backend, clock):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    torch.set_num_threads(threads)
    mesh = init_device_mesh("cpu", (1,))
    c, f, t = _data(n)
    out = {"plain eager": _run_variant("eager", backend, c, f, t, repeats, clock),
           "plain torch.compile": _run_variant("torch.compile", backend, c, f, t, repeats,
                                               clock)}
    sc, sf, st = (from_local(a, mesh, [Shard(1)], [n]) for a in (c, f, t))
    for name in (*VARIANTS, "compile_local (all row-local)"):
        out[f"ShardTensor {name}"] = _run_variant(name, backend, sc, sf, st, repeats, clock)
    out["graphs"] = graph_breaks(backend, sc, sf, st)
    return out


def block_rank(rank, world_size, sizes, depths, repeats, threads, backend, clock):
    """One pointwise MLP block (32 -> 64 -> ... -> 32, ``depth`` hidden layers), fwd+bwd on a
    1-rank mesh: plain torch, ShardTensor eager (one dispatch per op), compile_local (one
    dispatch per block)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models.transolver import MLP
    from meshshard.shardtensor import Shard, compile_local, from_local

    torch.set_num_threads(threads)
    mesh = init_device_mesh("cpu", (1,))
    out = {}
    for depth in depths:
        torch.manual_seed(0)
        plain = MLP(32, 64, 32, n_layers=depth)
        torch.manual_seed(0)
        local = compile_local(MLP(32, 64, 32, n_layers=depth), backend=backend)
        for n in sizes:
            x = torch.randn(1, n, 32, requires_grad=True)
            sx = from_local(x, mesh, [Shard(1)], [n])
            for name, m, inp in (("plain", plain, x), ("eager", plain, sx),
                                 ("compile_local", local, sx)):

                def step(m=m, inp=inp):
                    m.zero_grad(set_to_none=True)
                    m(inp).sum().backward()

                out[(depth, n, name)] = _time(step, repeats, clock)
    return out


def scaling_rank(rank, world_size, n, repeats, threads, backend):
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    torch.set_num_threads(threads)
    mesh = init_device_mesh("cpu", (world_size,))
    first = int(n * 0.45)
    sizes = [first, n - first]  # deliberately uneven
    c, f, t = _data(n)
    off = sum(sizes[:rank])
    sl = slice(off, off + sizes[rank])
    parts = [a[:, sl].clone() for a in (c, f, t)]
    sc, sf, st = (from_local(a, mesh, [Shard(1)], sizes) for a in parts)
    return {name: _run_variant(name, backend, sc, sf, st, repeats) for name in VARIANTS}


CORE = ("one process", "today eager", "today compile_sharded", "aten eager",
        "aten torch.compile")


def core_rank(rank, world_size, n, repeats, threads, backend):
    """Section 4: per-rank CPU seconds per step (best, compile) of every CORE variant."""
    import os

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from meshshard.models import Transolver
    from meshshard.shardtensor import compile_sharded, from_local
    from meshshard.shardtensor._aten import from_local as from_local_aten

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"/tmp/meshshard-inductor-{os.getpid()}"
    torch.set_num_threads(threads)
    mesh = init_device_mesh("cpu", (world_size,))
    first = int(n * 0.45)
    sizes = [first, n - first]
    full = _data(n)
    off = sum(sizes[:rank])
    parts = [a[:, off : off + sizes[rank]].clone() for a in full]
    today = [from_local(a, mesh, [Shard(1)], sizes, validate=False) for a in parts]
    aten = [from_local_aten(a, mesh, [Shard(1)], sizes, validate=False) for a in parts]
    out = {}
    calls = {"n": 0}

    def counting(gm, example_inputs):
        calls["n"] += 1
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)
        return gm.forward

    for name in CORE:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Transolver(**MODEL)
        fwd, data = model, aten
        if name == "one process":
            data = full
        elif name.startswith("today"):
            data = today
            if name.endswith("compile_sharded"):
                compile_sharded(model, backend=backend)
        elif name.endswith("torch.compile"):
            fwd = torch.compile(model, backend=counting)
        c, f, t = data

        def step(model=model, fwd=fwd, c=c, f=f, t=t):
            model.zero_grad(set_to_none=True)
            ((fwd(c, f) - t) ** 2).mean().backward()

        out[name] = _time(step, repeats, "cpu")
    out["compiles"] = calls["n"]
    return out


def _core_table(points, repeats, threads, backend) -> None:
    print()
    print("Issue 22 core, 2 gloo ranks (45/55 split), CPU ms per step, slowest rank (compile s "
          "in brackets); overhead = variant - one process:")
    print("| points | " + " | ".join(CORE) + " | aten compiles | aten torch.compile / today "
          "eager | overhead today eager / aten eager / aten torch.compile (ms) |")
    print("|---:|" + "---:|" * (len(CORE) + 3))
    for n in points:
        reps = run_ranks(core_rank, 2, n, repeats, threads, backend, timeout=3600)
        best = {k: max(r[k][0] for r in reps) for k in CORE}
        comp = {k: max(r[k][1] for r in reps) for k in CORE}
        cells = []
        for k in CORE:
            cell = f"{best[k] * 1e3:.1f}"
            if "compile" in k:
                cell += f" [{comp[k]:.0f}]"
            cells.append(cell)
        base = best["one process"]
        over = " / ".join(f"{(best[k] - base) * 1e3:+.1f}" for k in
                          ("today eager", "aten eager", "aten torch.compile"))
        print(f"| {n:,} | " + " | ".join(cells) + f" | {max(r['compiles'] for r in reps)} | "
              f"{best['aten torch.compile'] / best['today eager']:.2f}x | {over} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="1000,10000,100000")
    ap.add_argument("--overhead-points", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend")
    ap.add_argument("--block-points", default="1000,10000")
    ap.add_argument("--block-depths", default="0,8", help="hidden layers of the MLP block")
    ap.add_argument("--clock", choices=sorted(CLOCK), default="wall",
                    help="overhead table: wall time, or this process's CPU time (steadier on "
                    "a loaded machine)")
    ap.add_argument("--core", action="store_true", help="also run section 4 (issue 22)")
    ap.add_argument("--core-only", action="store_true", help="run section 4 only")
    args = ap.parse_args(argv)
    points = [int(float(s)) for s in args.points.split(",") if s]
    if args.core_only:
        print(f"# Transolver {MODEL}, fwd+bwd, best of {args.repeats}, backend {args.backend}, "
              f"torch {torch.__version__}, {args.threads} thread(s)/process")
        _core_table(points, args.repeats, args.threads, args.backend)
        return 0
    layers = MODEL["n_layers"]
    print(f"# torch.compile benchmark: Transolver {MODEL}, fwd+bwd, best of {args.repeats}, "
          f"backend {args.backend}")
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, {args.threads} thread(s)/process")
    print(f"# compile_local plan: {PLAN}; all row-local: {PLAN_ALL}")
    n = args.overhead_points
    rep = run_ranks(overhead_rank, 1, n, args.repeats, args.threads, args.backend, args.clock,
                    timeout=3600)[0]
    gb = rep.pop("graphs")
    plain = rep["plain eager"][0]
    eager_over = (rep["ShardTensor eager"][0] - plain) / layers * 1e3
    print()
    print(f"torch.compile(model) on ShardTensors, one step: {gb['graphs']} graphs, "
          f"{gb['breaks']} graph breaks, frames {gb['frames']}; break reasons:")
    for reason, k in gb["reasons"].items():
        print(f"  {k:4d}  {reason}")
    print()
    print(f"Dispatch overhead at {n:,} points, 1-rank mesh ({args.clock} clock):")
    print("| variant | step (ms) | compile (s) | overhead per layer (ms) | vs eager overhead |")
    print("|---|---:|---:|---:|---:|")
    for name, (best, comp) in rep.items():
        over = (best - plain) / layers * 1e3
        ratio = over / eager_over if name.startswith("ShardTensor") and eager_over > 0 else None
        rs = f"{ratio:.2f}" if ratio is not None else ""
        print(f"| {name} | {best * 1e3:.1f} | {comp:.1f} | {over:+.2f} | {rs} |", flush=True)
    depths = [int(d) for d in args.block_depths.split(",") if d]
    bsizes = [int(float(v)) for v in args.block_points.split(",") if v]
    if depths and bsizes:
        blk = run_ranks(block_rank, 1, bsizes, depths, args.repeats, args.threads, args.backend,
                        args.clock, timeout=3600)[0]
        print()
        print(f"One pointwise MLP block, fwd+bwd, 1-rank mesh ({args.clock} clock); overhead = "
              "time - plain torch:")
        print("| hidden layers | ops | points | plain (ms) | eager (ms) | compile_local (ms) | "
              "eager overhead (ms) | compile_local overhead (ms) |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for d in depths:
            for n in bsizes:
                p, e, c = (blk[(d, n, k)][0] * 1e3 for k in ("plain", "eager", "compile_local"))
                print(f"| {d} | {3 + 3 * d} | {n:,} | {p:.3f} | {e:.3f} | {c:.3f} | "
                      f"{e - p:+.3f} | {c - p:+.3f} |", flush=True)
    print()
    print("Step time, 2 gloo ranks (45/55 split), slowest rank:")
    print("| points | eager (ms) | torch.compile (ms) | compile_local (ms) | "
          "compile_sharded (ms) | eager / torch.compile | eager / compile_local | "
          "eager / compile_sharded | compile (s) tc / cl / cs |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in [int(float(s)) for s in args.points.split(",") if s]:
        reps = run_ranks(scaling_rank, 2, n, args.repeats, args.threads, args.backend,
                         timeout=3600)
        best = {k: max(r[k][0] for r in reps) for k in VARIANTS}
        comp = {k: max(r[k][1] for r in reps) for k in VARIANTS}
        e, tc, cl, cs = (best[k] for k in VARIANTS)
        print(f"| {n:,} | {e * 1e3:.1f} | {tc * 1e3:.1f} | {cl * 1e3:.1f} | {cs * 1e3:.1f} | "
              f"{e / tc:.2f}x | {e / cl:.2f}x | {e / cs:.2f}x | {comp['torch.compile']:.1f} / "
              f"{comp['compile_local']:.1f} / {comp['compile_sharded']:.1f} |", flush=True)
    if args.core:
        _core_table(points, args.repeats, args.threads, args.backend)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
