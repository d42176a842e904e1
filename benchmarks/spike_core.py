"""Issue 22 spike: today's ShardTensor (torch-function rules, autograd on the local piece)
against the aten-dispatch prototype (``meshshard.shardtensor._aten``: autograd on the wrapper),
side by side on the reference Transolver, forward + backward, in one run.

Per rank, CPU time per step (best of ``--repeats`` after warm-up), on 2 gloo ranks with an
uneven 45/55 split, and on a 1-rank mesh for the fixed overhead:

- one process, plain torch (the reference; at 2 ranks it is the same model on all points);
- today's ShardTensor, eager;
- the prototype, eager;
- the prototype under plain ``torch.compile(model)`` (inductor; dynamic shapes after the
  first recompile) — graphs and graph breaks counted;
- exactness: loss and every weight gradient against one process (fp32 and fp64);
- compilations over a sequence of 6 samples with different point counts and splits.

    python benchmarks/spike_core.py                       # 1k, 10k, 100k points
    python benchmarks/spike_core.py --points 1000,10000 --repeats 5
"""

from __future__ import annotations

import argparse
import time

import torch

from meshshard.testing import run_ranks

MODEL = dict(space_dim=3, fun_dim=2, out_dim=2, n_hidden=32, n_layers=2, heads=2, slices=16)


def _data(n: int, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, n, k, generator=g, dtype=dtype) for k in (3, 2, 2))


def _time(fn, repeats):
    t0 = time.process_time()
    fn()
    first = time.process_time() - t0
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best, max(first - best, 0.0)


def _model(dtype=torch.float32):
    from meshshard.models import Transolver

    torch.manual_seed(0)
    return Transolver(**MODEL).to(dtype)


def _step(model, fwd, c, f, t):
    def step():
        model.zero_grad(set_to_none=True)
        loss = ((fwd(c, f) - t) ** 2).mean()
        loss.backward()
        return loss

    return step


def _pieces(arrays, sizes, rank):
    off = sum(sizes[:rank])
    return [a[:, off : off + sizes[rank]].clone() for a in arrays]


def _wrap_today(parts, mesh, sizes):
    from meshshard.shardtensor import Shard, from_local

    return [from_local(p, mesh, [Shard(1)], list(sizes), validate=False) for p in parts]


def _wrap_aten(parts, mesh, sizes):
    from torch.distributed.tensor import Shard

    from meshshard.shardtensor._aten import from_local_aten

    return [from_local_aten(p, mesh, [Shard(1)], [tuple(sizes)]) for p in parts]


def _counting_backend():
    from torch._inductor.compile_fx import compile_fx

    calls = {"n": 0}

    def backend(gm, example_inputs):
        calls["n"] += 1
        return compile_fx(gm, example_inputs)

    return backend, calls


def timing_rank(rank, world, points, repeats, threads):
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(threads)
    mesh = init_device_mesh("cpu", (world,))
    out = {}
    for n in points:
        first = int(n * 0.45) if world > 1 else n
        sizes = (first, n - first) if world > 1 else (n,)
        full = _data(n)
        m = _model()
        out[(n, "one process")] = _time(_step(m, m, *full), repeats)
        parts = _pieces(full, sizes, rank)
        m = _model()
        out[(n, "today eager")] = _time(_step(m, m, *_wrap_today(parts, mesh, sizes)), repeats)
        m = _model()
        out[(n, "aten eager")] = _time(_step(m, m, *_wrap_aten(parts, mesh, sizes)), repeats)
        torch._dynamo.reset()
        m = _model()
        backend, calls = _counting_backend()
        cm = torch.compile(m, backend=backend)
        out[(n, "aten torch.compile")] = _time(_step(m, cm, *_wrap_aten(parts, mesh, sizes)),
                                               repeats)
        out[(n, "compiles")] = calls["n"]
    return out


def exact_rank(rank, world, sizes_list):
    """Largest relative difference of loss and weight gradients from one process."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    res = {}
    for dtype in (torch.float32, torch.float64):
        for sizes in sizes_list:
            full = _data(sum(sizes), dtype=dtype)
            m = _model(dtype)
            ref = _step(m, m, *full)()
            ref_g = [p.grad.clone() for p in m.parameters()]
            for name, wrap in (("today", _wrap_today), ("aten", _wrap_aten)):
                m = _model(dtype)
                loss = _step(m, m, *wrap(_pieces(full, sizes, rank), mesh, sizes))()
                lv = float(loss.item()) if name == "aten" else float(loss.full_tensor())
                g = max(float((p.grad - r).abs().max() / r.abs().max())
                        for p, r in zip(m.parameters(), ref_g))
                res[(str(dtype)[6:], sizes, name)] = (abs(lv - float(ref)) / abs(float(ref)), g)
    return res


def dynamic_rank(rank, world, layouts):
    """Train-like loop over samples of different sizes and splits: compilations, and the
    largest loss difference between compiled and eager."""
    from torch.distributed.device_mesh import init_device_mesh

    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    backend, calls = _counting_backend()
    m = _model()
    cm = torch.compile(m, backend=backend)
    worst = 0.0
    for k, sizes in enumerate(layouts):
        parts = _pieces(_data(sum(sizes), seed=k), sizes, rank)
        e = _step(m, m, *_wrap_aten(parts, mesh, sizes))().item()
        c = _step(m, cm, *_wrap_aten(parts, mesh, sizes))().item()
        worst = max(worst, abs(e - c) / abs(e))
    return {"compiles": calls["n"], "worst": worst}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="1000,10000,100000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    points = [int(float(p)) for p in args.points.split(",")]

    print("exactness (max relative difference from one process: loss, weight grads)")
    ex = run_ranks(exact_rank, 2, [(3, 5), (0, 8), (450, 550)], timeout=600)[0]
    for k, (lv, g) in sorted(ex.items(), key=str):
        print(f"  {k[0]:8s} {str(k[1]):12s} {k[2]:6s} loss {lv:.1e}  grads {g:.1e}")
    ex3 = run_ranks(exact_rank, 3, [(7, 0, 13)], timeout=600)[0]
    for k, (lv, g) in sorted(ex3.items(), key=str):
        print(f"  {k[0]:8s} {str(k[1]):12s} {k[2]:6s} loss {lv:.1e}  grads {g:.1e}")

    layouts = [(450, 550), (700, 500), (1300, 900), (300, 1500), (2000, 1100), (800, 801)]
    dyn = run_ranks(dynamic_rank, 2, layouts, timeout=1200)
    print(f"dynamic sizes, 6 layouts {layouts}: compilations per rank "
          f"{[d['compiles'] for d in dyn]}, worst |compiled-eager|/eager loss "
          f"{max(d['worst'] for d in dyn):.1e}")

    for world in (1, 2):
        res = run_ranks(timing_rank, world, points, args.repeats, args.threads, timeout=3000)
        print(f"\n{world} rank(s), CPU ms per step per rank (best of {args.repeats}; "
              "compile time in brackets)")
        names = ("one process", "today eager", "aten eager", "aten torch.compile")
        print(f"  {'points':>8s} " + " ".join(f"{n:>20s}" for n in names))
        for n in points:
            row = []
            for name in names:
                best = max(r[(n, name)][0] for r in res)
                extra = max(r[(n, name)][1] for r in res)
                cell = f"{best * 1e3:.1f}"
                if name.endswith("compile"):
                    cell += f" [{extra:.0f}s]"
                row.append(f"{cell:>20s}")
            print(f"  {n:>8d} " + " ".join(row))
            base = max(r[(n, "one process")][0] for r in res)
            if world == 1:
                over = {name: (max(r[(n, name)][0] for r in res) - base) * 1e3
                        for name in names[1:]}
                print("           overhead over one process (ms/step): "
                      + ", ".join(f"{k} {v:+.1f}" for k, v in over.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
