"""Composing domain parallelism with data parallelism: per-rank training state, DDP vs FSDP2.

Memory section: 4 gloo ranks as a 2 x 2 (data x domain) mesh train a widened Transolver
(>= 50M parameters by default) one Adam step on ShardTensor inputs. Per rank it counts the
bytes this rank *holds* (each tensor's local storage; a DTensor's local shard) of

- parameters, and
- optimizer state (Adam ``exp_avg``, ``exp_avg_sq``, ``step``),

with DDP (replicated everywhere), FSDP2 over ``data`` and FSDP2 over ``data`` x ``domain``
flattened, and prints the ratio to DDP. Target: FSDP2 (flattened) <= 0.3 x DDP at 4 ranks.
Gradient bytes are printed too (after the step; FSDP2 keeps sharded gradients).

Compile section: ``benchmarks/bench_compile.py`` (compiled vs eager step time at 1k, 10k
and 100k points, dispatch overhead per layer at 1k points), with the arguments given in
``--compile-args``.

    python benchmarks/bench_composition.py                      # ~53M parameters, 4 ranks
    python benchmarks/bench_composition.py --hidden 256 --layers 2 \
        --compile-args "--points 1000,10000 --repeats 3"           # quick
    python benchmarks/bench_composition.py --sections memory    # one section
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from meshshard.testing import run_ranks

MODES = (("ddp", None), ("fsdp", ("data",)), ("fsdp", ("data", "domain")))


def _local_bytes(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    if hasattr(t, "to_local"):  # DTensor: this rank's shard
        t = t.to_local()
    return t.numel() * t.element_size()


def state_bytes(rank, world_size, mode, shard_dims, hidden, layers, points):
    """One Adam step on the 2 x 2 mesh; this rank's parameter / grad / Adam-state bytes."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.parallel import data_parallel
    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "domain"))
    torch.manual_seed(0)
    model = Transolver(3, 2, 2, n_hidden=hidden, n_layers=layers, heads=8, slices=16)
    n_params = sum(p.numel() for p in model.parameters())
    m = data_parallel(model, mesh, mode=mode, shard_dims=shard_dims)
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    sizes = (points // 3, points - points // 3)  # uneven over domain
    pc = mesh.get_local_rank("domain")
    g = torch.Generator().manual_seed(mesh.get_local_rank("data"))
    c, f, t = (torch.randn(1, sizes[pc], d, generator=g) for d in (3, 2, 2))
    c, f, t = (from_local(a, mesh["domain"], [Shard(1)], sizes) for a in (c, f, t))
    loss = ((m(c, f) - t) ** 2).mean()
    loss.backward()
    opt.step()
    params = sum(_local_bytes(p) for p in m.parameters())
    grads = sum(_local_bytes(p.grad) for p in m.parameters())
    optim = sum(_local_bytes(v) for s in opt.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))
    return {"n_params": n_params, "params": params, "grads": grads, "optim": optim}


def memory_section(args: argparse.Namespace) -> None:
    print(f"## per-rank training state, 4 ranks (2 x 2 data x domain), hidden={args.hidden} "
          f"layers={args.layers}")
    rows = {}
    for mode, dims in MODES:
        reps = run_ranks(state_bytes, 4, mode, dims, args.hidden, args.layers, args.points,
                         timeout=args.timeout)
        name = mode if dims is None else f"{mode} over {' x '.join(dims)}"
        rows[name] = max(reps, key=lambda r: r["params"] + r["optim"])  # the fullest rank
    n = next(iter(rows.values()))["n_params"]
    print(f"model parameters: {n / 1e6:.1f} M")
    print(f"{'mode':<26}{'params MB':>11}{'Adam MB':>10}{'state MB':>10}{'grads MB':>10}"
          f"{'state/DDP':>11}")
    base = None
    for name, r in rows.items():
        state = r["params"] + r["optim"]
        base = base or state
        print(f"{name:<26}{r['params'] / 2**20:>11.1f}{r['optim'] / 2**20:>10.1f}"
              f"{state / 2**20:>10.1f}{r['grads'] / 2**20:>10.1f}{state / base:>11.3f}")
    flat = rows["fsdp over data x domain"]
    ratio = (flat["params"] + flat["optim"]) / base
    verdict = "meets" if ratio <= 0.3 else "misses"
    print(f"FSDP2 (data x domain) per-rank state / DDP's = {ratio:.3f} ({verdict} target <= 0.3)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=7)
    ap.add_argument("--points", type=int, default=256, help="points per sample")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--compile-args", default="", help="arguments of bench_compile.py")
    ap.add_argument("--sections", default="memory,compile", help="sections to run, in order")
    args = ap.parse_args(argv)
    sections: dict[str, Callable[[argparse.Namespace], None]] = {
        "memory": memory_section,
        "compile": compile_section,
    }
    for name in args.sections.split(","):
        sections[name](args)
    return 0


def compile_section(args: argparse.Namespace) -> None:
    """Compiled vs eager: ``bench_compile.py`` in this run (its own spawned ranks)."""
    import shlex
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_compile

    print("\n== torch.compile vs eager (benchmarks/bench_compile.py " + args.compile_args + ")")
    bench_compile.main(shlex.split(args.compile_args))


if __name__ == "__main__":
    raise SystemExit(main())
