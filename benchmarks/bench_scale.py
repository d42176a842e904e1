"""Scale-out benchmark: ``partition_distributed`` on 1, 2, 4 gloo ranks against one process
running ``partition()`` on the same points.

Every configuration runs in fresh processes (``meshshard.testing.run_ranks``, 1 torch thread
per rank). Points are uniform float32 in the unit cube, generated in fixed 1M-row chunks
(chunk ``c`` from seed ``c``), so every layout partitions the same global point set and each
rank generates only its own row range. Per configuration it prints wall time of the partition
call (slowest rank), CPU time (sum over ranks), per-rank peak RSS (VmHWM, whole process) and
the peak above the rank's RSS just before its points were made (the partition's own memory,
plus its input), and the bytes each rank sent + received per phase.

At the end, a paper model of ``--model-n`` points on ``--model-ranks`` ranks: bytes per rank
per phase and the peak RSS, scaled from the measured per-row costs of the largest run.

Usage::

    python benchmarks/bench_scale.py --sizes 20e6 50e6 --ranks 1 2 4
    python benchmarks/bench_scale.py --sizes 2e6 --ranks 1 2 --methods hilbert   # quick
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np

from meshshard.testing.memory import peak_rss_bytes, rss_bytes

CHUNK = 1 << 20


def make_rows(start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of the global uniform float32 point set."""
    out = np.empty((stop - start, 3), dtype=np.float32)
    c0, c1 = start // CHUNK, (stop - 1) // CHUNK if stop > start else -1
    for c in range(c0, c1 + 1):
        block = np.random.default_rng(c).random((CHUNK, 3), dtype=np.float32)
        lo, hi = max(start, c * CHUNK), min(stop, (c + 1) * CHUNK)
        out[lo - start : hi - start] = block[lo - c * CHUNK : hi - c * CHUNK]
    return out


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def single(rank: int, world: int, n: int, method: str, parts: int) -> dict:
    from meshshard.partition import partition

    base = rss_bytes()
    pts = make_rows(0, n)
    t0, c0 = time.perf_counter(), _cpu()
    part = partition(pts, parts, method)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    assert int(part.sizes.sum()) == n
    return {"wall": wall, "cpu": cpu, "hwm": peak_rss_bytes(), "base": base}


def ranked(rank: int, world: int, n: int, method: str, parts: int, no_pack: bool = False) -> dict:
    import torch.distributed as dist

    from meshshard.partition.distributed import _rcb, _sfc, partition_distributed

    if no_pack:  # the general (code, row) path that inputs too large to pack take
        _sfc.PACK_BITS = _rcb.PACK_BITS = 0

    start, stop = (n * rank) // world, (n * (rank + 1)) // world
    base = rss_bytes()
    pts = make_rows(start, stop)
    dist.barrier()
    t0, c0 = time.perf_counter(), _cpu()
    dp = partition_distributed(pts, parts, None, method)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    dist.barrier()
    return {
        "wall": wall, "cpu": cpu, "hwm": peak_rss_bytes(), "base": base,
        "rows": stop - start, "phases": dp.exchange_bytes, "owned": int(dp.order.size),
        "phase_s": dp.phase_seconds,
    }  # fmt: skip


def gib(b: float) -> str:
    return f"{b / 2**30:.2f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", type=float, default=[20e6, 50e6])
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--methods", nargs="+", default=["hilbert", "rcb"])
    ap.add_argument("--parts", type=int, default=64, help="parts of the partition")
    ap.add_argument("--model-n", type=float, default=1e9)
    ap.add_argument("--model-ranks", type=int, default=64)
    args = ap.parse_args(argv)
    from meshshard.testing import run_ranks

    print(f"host: {os.cpu_count()} cores; ranks run 1 torch thread each; parts={args.parts}")
    print(
        "| N | method | setup | wall (s) | cpu (s, all ranks) | peak RSS/rank (GiB, max) "
        "| peak above start/rank (GiB) | target 1.5/P x single | exchanged/rank (GiB) |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    last = {}
    profiles = []
    for n in [int(s) for s in args.sizes]:
        for method in args.methods:
            ref = run_ranks(single, 1, n, method, args.parts, timeout=3600)[0]
            print(f"| {n:,} | {method} | partition() 1 process | {ref['wall']:.2f} | "
                  f"{ref['cpu']:.2f} | {gib(ref['hwm'])} | {gib(ref['hwm'] - ref['base'])} "
                  f"| - | - |", flush=True)  # fmt: skip
            for w in args.ranks:
                got = run_ranks(ranked, w, n, method, args.parts, timeout=3600)
                wall = max(g["wall"] for g in got)
                cpu = sum(g["cpu"] for g in got)
                hwm = max(g["hwm"] for g in got)
                above = max(g["hwm"] - g["base"] for g in got)
                xb = max(sum(g["phases"].values()) for g in got)
                target = 1.5 / w * ref["hwm"]
                print(f"| {n:,} | {method} | distributed {w} rank(s) | {wall:.2f} | {cpu:.2f} "
                      f"| {gib(hwm)} | {gib(above)} | {gib(target)} "
                      f"{'ok' if hwm <= target else 'MISSED'} | {gib(xb)} |",
                      flush=True)  # fmt: skip
                last[method] = (n, w, got)
                profiles.append((n, method, w, got))
    print("\nPhase profile: wall seconds per phase (computing and waiting), slowest rank; "
          "phases in the order they run")
    for n, method, w, got in profiles:
        names = list(dict.fromkeys(k for g in got for k in g["phase_s"] if k not in ("start",)))
        cells = ", ".join(f"{k} {max(g['phase_s'].get(k, 0.0) for g in got):.2f}" for k in names)
        print(f"- {n:,} {method} {w} rank(s): {cells}")
    for method, (n, _w, _got) in list(last.items()):
        if _packs(method, n, args.parts) != _packs(method, int(args.model_n), args.parts):
            n2, w2 = 16 << 20, 4
            print(f"\n({method}: {args.model_n:.0e} points take the unpacked key path; its "
                  f"per-row costs measured at N={n2:,} on {w2} ranks)")  # fmt: skip
            got = run_ranks(ranked, w2, n2, method, args.parts, True, timeout=3600)
            last[method] = (n2, w2, got)
    model(last, int(args.model_n), args.model_ranks, args.parts)


def _packs(method: str, n: int, parts: int) -> bool:
    """Whether the distributed partitioner packs keys into one int64 at this size (3-D)."""
    from meshshard.partition.sfc import default_bits

    bits = default_bits(n, 3)
    if method == "rcb":
        return parts.bit_length() + 3 * bits <= 63
    return 3 * bits + max((n - 1).bit_length(), 1) <= 63


def model(last: dict, n_model: int, ranks: int, parts: int) -> None:
    """Bytes per rank per phase for ``n_model`` points on ``ranks`` ranks: exchanges scale with
    local rows (measured bytes per row); RCB selection rounds scale with ranks x tree nodes."""
    from meshshard.partition.distributed._select import GATHER_MAX, PIVOTS, SAMPLES

    rows = n_model / ranks
    print(f"\nPaper model: {n_model:.0e} points on {ranks} ranks = {rows:,.0f} rows per rank")
    for method, (n, w, got) in last.items():
        g = max(got, key=lambda r: r["rows"])
        base = max(r["base"] for r in got)
        per_row_mem = (g["hwm"] - g["base"]) / g["rows"]
        print(f"\n{method} (per-row costs from N={n:,} on {w} rank(s), {g['rows']:,} rows "
              f"on the largest rank)")  # fmt: skip
        print("| phase | measured bytes/row (sent + received) | model per rank (GiB) |")
        print("|---|---:|---:|")
        for phase, b in sorted(g["phases"].items()):
            per = b / g["rows"]
            if phase == "rcb select":
                # per tree level: <= 3 sample rounds of nodes x SAMPLES x 24 B from every rank
                levels = max(parts - 1, 1).bit_length()
                rounds = 1
                while rows * ranks / (PIVOTS**rounds) > GATHER_MAX:
                    rounds += 1
                est = sum(min(2**lv, parts // 2) for lv in range(levels)) * rounds
                est *= SAMPLES * 24 * ranks + (PIVOTS + 1) * 16
                print(f"| {phase} | {per:.2f} | {gib(est)} (ranks x nodes, not rows) |")
            elif per < 0.5:
                print(f"| {phase} | {per:.3f} | ~0 (all_reduce / all_gather of O(ranks)) |")
            else:
                print(f"| {phase} | {per:.2f} | {gib(per * rows)} |")
        print(f"| input points (float32) | 12.00 | {gib(12 * rows)} |")
        print(f"| peak RSS = process {gib(base)} GiB + {per_row_mem:.1f} B/row | - | "
              f"{gib(base + per_row_mem * rows)} |")  # fmt: skip


if __name__ == "__main__":
    main()
