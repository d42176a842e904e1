"""Distributed kNN: traffic against a ring and wall time against single-process cKDTree.

One run prints markdown tables:

0. the device spatial index (``backend="grid"``) on the CPU: its time against cKDTree at 1M
   points and against the tiled brute force at 200k points, as ratios;
1. single-process baseline: scipy cKDTree (build + query, ``workers=-1``) on all N points;
2. simulated traffic at P ranks (default 8 and 64): the *same* planning code the distributed
   op runs (local kNN bound -> box pruning -> bounded answers, from ``meshshard.ops``) executed
   for P shards in one process; rows sent per point for our kNN against a ring (P - 1: every
   point visits every other rank);
3. real gloo ranks (default 2 and 4) on this machine: wall time of ``meshshard.ops.functional.knn``
   (forward) with traffic counters, checked against the single-process answer on sampled rows.

Usage::

    .venv/bin/python benchmarks/bench_ops.py            # N = 1M (several minutes on 2 cores)
    .venv/bin/python benchmarks/bench_ops.py --n 200000 # quick run
    .venv/bin/python benchmarks/bench_ops.py --only-index  # the spatial index table only

Shards come from ``meshshard.partition.partition`` when it is available, otherwise from the
small reference RCB / Morton splitters below (marked ``(bench)`` in the tables).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


# ----------------------------------------------------------------------------- data / shards
def make_cloud(n: int, kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.random((n, 3))
    # clustered: blobs plus a thin dense layer (boundary-layer-like)
    centres = rng.random((8, 3))
    pts = centres[rng.integers(0, 8, n)] + rng.normal(scale=0.03, size=(n, 3))
    layer = rng.random(n) < 0.3
    pts[layer, 2] = 0.5 + rng.normal(scale=1e-3, size=int(layer.sum()))
    return pts


def _morton_key(points: np.ndarray) -> np.ndarray:
    lo, hi = points.min(0), points.max(0)
    q = ((points - lo) / np.maximum(hi - lo, 1e-300) * (2**21 - 1)).astype(np.uint64)
    key = np.zeros(points.shape[0], dtype=np.uint64)
    for b in range(21):
        for d in range(3):
            key |= ((q[:, d] >> np.uint64(b)) & np.uint64(1)) << np.uint64(3 * b + d)
    return key


def _bench_rcb(points: np.ndarray, parts: int) -> np.ndarray:
    assignment = np.empty(points.shape[0], dtype=np.int64)
    stack = [(np.arange(points.shape[0]), 0, parts)]
    while stack:
        idx, first, p = stack.pop()
        if p == 1:
            assignment[idx] = first
            continue
        pts = points[idx]
        axis = int(np.argmax(pts.max(0) - pts.min(0)))
        left = p // 2
        cut = idx.size * left // p
        o = np.argpartition(pts[:, axis], cut) if 0 < cut < idx.size else np.arange(idx.size)
        stack.append((idx[o[:cut]], first, left))
        stack.append((idx[o[cut:]], first + left, p - left))
    return assignment


def shard(points: np.ndarray, parts: int, method: str):
    """(partition, label) for ``method`` on ``parts`` shards."""
    from meshshard.partition.record import Partition

    try:
        from meshshard.partition import partition

        return partition(points, parts, method=method), method
    except (ImportError, AttributeError, NotImplementedError):
        pass
    key = _morton_key(points)
    if method == "rcb":
        a = _bench_rcb(points, parts)
    elif method == "morton":
        a = np.empty(points.shape[0], dtype=np.int64)
        a[np.argsort(key, kind="stable")] = np.arange(points.shape[0]) * parts // points.shape[0]
    else:
        raise SystemExit(f"method {method!r} needs meshshard.partition.partition (not available)")
    return Partition.from_assignment(a, parts, key=key, method=method), f"{method} (bench)"


# ----------------------------------------------------------------------------- simulation
def simulate(stored: np.ndarray, sizes: np.ndarray, k: int, nboxes: int) -> dict:
    """Run the distributed kNN's planning for P shards in one process; count rows moved."""
    import torch

    from meshshard.ops import kernels
    from meshshard.ops._regions import knn_forward_mask, shard_boxes
    from meshshard.ops.functional import answer_knn_queries

    P = sizes.size
    off = np.concatenate([[0], np.cumsum(sizes)])
    xs = [torch.from_numpy(stored[off[p] : off[p + 1]]) for p in range(P)]
    boxes = torch.stack([shard_boxes(x, nboxes) for x in xs])
    fwd = 0
    inbox: list[list[torch.Tensor]] = [[] for _ in range(P)]
    for p, x in enumerate(xs):
        d2, _ = kernels.knn(x, x, k, backend="kdtree")
        bound = d2[:, k - 1] if x.shape[0] else torch.empty(0, dtype=torch.float64)
        mask, bound = knn_forward_mask(x, bound, boxes, p, k)
        fwd += int(mask.sum())
        for q in torch.nonzero(mask.any(0)).flatten().tolist():
            rows = torch.nonzero(mask[:, q]).flatten()
            inbox[q].append(torch.cat([x[rows], bound[rows, None]], 1))
    answers = 0
    for q in range(P):
        if inbox[q]:
            _, ri = answer_knn_queries(xs[q], torch.cat(inbox[q]), k, backend="kdtree")
            answers += int((ri >= 0).sum())
    n = int(sizes.sum())
    return {"fwd": fwd / n, "ans": answers / n}


# ----------------------------------------------------------------------------- local index
def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_index(n_tree: int, n_brute: int, brute_queries: int, k: int, kind: str) -> None:
    """The device spatial index (``backend="grid"``, the cell list) on the CPU, against
    cKDTree at ``n_tree`` points and against the tiled brute force at ``n_brute`` points (the
    brute force on ``brute_queries`` queries, scaled linearly to all: its cost is linear in
    the queries). Every backend gets the same torch thread budget; answers are compared."""
    import torch

    from meshshard.ops import kernels

    threads = torch.get_num_threads()
    print(f"### Local spatial index, one process, {threads} thread(s), k={k} ({kind})\n")
    print("| N | queries | baseline | baseline s | grid s | grid / baseline | same answers |")
    print("|---|---|---|---|---|---|---|")
    x = torch.from_numpy(make_cloud(n_tree, kind, seed=1))
    out = {}
    t_tree = _timed(lambda: out.update(t=kernels.knn(x, x, k, backend="kdtree")))
    t_grid = _timed(lambda: out.update(g=kernels.knn(x, x, k, backend="grid")))
    same = bool((out["t"][1] == out["g"][1]).all())
    print(f"| {n_tree:,} | {n_tree:,} | cKDTree (build + query) | {t_tree:.2f} | {t_grid:.2f} "
          f"| {t_grid / t_tree:.2f} (target <= 3) | {'yes' if same else 'NO'} |", flush=True)
    x = torch.from_numpy(make_cloud(n_brute, kind, seed=2))
    q = x[torch.randperm(n_brute, generator=torch.Generator().manual_seed(0))[:brute_queries]]
    t_b = _timed(lambda: out.update(b=kernels.knn(x, q, k, backend="brute")))
    t_b_all = t_b * n_brute / brute_queries
    t_grid = _timed(lambda: out.update(g=kernels.knn(x, x, k, backend="grid")))
    gq = kernels.knn(x, q, k, backend="grid")[1]
    same = bool((out["b"][1] == gq).all())
    print(f"| {n_brute:,} | {n_brute:,} | brute ({t_b:.1f} s on {brute_queries:,} queries, "
          f"x{n_brute / brute_queries:.0f}) | {t_b_all:.1f} | {t_grid:.2f} "
          f"| {t_grid / t_b_all:.4f} = {t_b_all / t_grid:.0f}x faster (target >= 20x) "
          f"| {'yes' if same else 'NO'} |\n", flush=True)


# ----------------------------------------------------------------------------- real ranks
def _rank_fn(rank: int, world: int, n: int, k: int, kind: str, method: str, nboxes: int):
    import torch
    import torch.distributed as dist

    from meshshard.ops.functional import knn

    pts = make_cloud(n, kind)
    part, _ = shard(pts, world, method)
    local = torch.from_numpy(part.split(part.apply(pts))[rank].copy())
    dist.barrier()
    t0 = time.perf_counter()
    stats: dict = {}
    _, idx = knn(local, k, stats=stats, nboxes=nboxes)
    dist.barrier()
    wall = time.perf_counter() - t0
    return {"wall": wall, "stats": stats, "sample": idx[:500].numpy(), "n": local.shape[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--cloud", choices=["uniform", "clustered"], default="uniform")
    ap.add_argument("--ranks", default="2,4", help="real gloo rank counts ('' to skip)")
    ap.add_argument("--sim", default="8,64", help="simulated rank counts ('' to skip)")
    ap.add_argument("--methods", default="rcb,hilbert,morton,metis")
    ap.add_argument("--nboxes", type=int, default=16)
    ap.add_argument("--index-n", type=int, default=1_000_000,
                    help="points for the grid-vs-cKDTree comparison (0 to skip the index)")
    ap.add_argument("--brute-n", type=int, default=200_000)
    ap.add_argument("--brute-queries", type=int, default=2_000)
    ap.add_argument("--only-index", action="store_true", help="only the local index table")
    args = ap.parse_args(argv)
    if args.index_n:
        bench_index(args.index_n, args.brute_n, args.brute_queries, args.k, args.cloud)
    if args.only_index:
        return 0
    from scipy.spatial import cKDTree

    from meshshard.testing.distributed import run_ranks

    pts = make_cloud(args.n, args.cloud)
    print(
        f"## meshshard.ops.knn: N={args.n:,} ({args.cloud}), k={args.k}, "
        f"{args.nboxes} boxes per rank, {os.cpu_count()} CPU cores\n"
    )
    t0 = time.perf_counter()
    _, ref = cKDTree(pts).query(pts, k=args.k, workers=-1)
    t_ref = time.perf_counter() - t0
    print(f"single-process cKDTree build + query (workers=-1): {t_ref:.2f} s\n")

    methods = [m for m in args.methods.split(",") if m]
    sims = [int(p) for p in args.sim.split(",") if p]
    if sims:
        print("### Simulated traffic (rows sent per point)\n")
        print(
            "| P | shards | forwarded queries / pt | answer rows / pt | ring rows / pt "
            "| ring / ours (queries) | bytes / pt ours | bytes / pt ring |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for P in sims:
            for method in methods:
                try:
                    part, label = shard(pts, P, method)
                except SystemExit as exc:
                    print(f"| {P} | {method} | skipped: {exc} | | | | | |")
                    continue
                r = simulate(part.apply(pts), part.sizes, args.k, args.nboxes)
                ratio = (P - 1) / r["fwd"] if r["fwd"] else float("inf")
                # float64 coordinates; a query row is (x, y, z, bound), an answer is k rows of
                # (d2, index) + (x, y, z), padded (no count exchange); a ring hop carries
                # (x, y, z, index). "answer rows" counts the useful (within-bound) ones
                ours = r["fwd"] * 4 * 8 + r["fwd"] * args.k * 5 * 8
                ring = (P - 1) * 4 * 8
                print(
                    f"| {P} | {label} | {r['fwd']:.3f} | {r['ans']:.3f} | {P - 1} "
                    f"| {ratio:.0f}x | {ours:.1f} | {ring} |",
                    flush=True,
                )
        print()
    ranks = [int(p) for p in args.ranks.split(",") if p]
    if ranks:
        print("### Real gloo ranks on this machine (forward, wall time)\n")
        print(
            "| ranks | shards | wall s | cKDTree 1-proc s | forwarded / pt | answer rows / pt "
            "| exact on sampled rows |"
        )
        print("|---|---|---|---|---|---|---|")
        method = methods[0]
        for P in ranks:
            part, label = shard(pts, P, method)
            res = run_ranks(
                _rank_fn, P, args.n, args.k, args.cloud, method, args.nboxes, timeout=1800
            )
            wall = max(r["wall"] for r in res)
            fwd = sum(r["stats"]["queries_sent"] for r in res) / args.n
            ans = sum(r["stats"]["answer_rows"] for r in res) / args.n
            # check sampled rows against single-process cKDTree (sets; uniform floats: no ties)
            order = part.order
            inv = part.inverse
            ok = True
            offs = part.offsets
            for p, r in enumerate(res):
                rows = np.arange(offs[p], offs[p] + r["sample"].shape[0])
                want = inv[ref[order[rows]]]
                ok &= all(set(a) == set(b) for a, b in zip(r["sample"].tolist(), want.tolist()))
            print(
                f"| {P} | {label} | {wall:.2f} | {t_ref:.2f} | {fwd:.3f} | {ans:.3f} "
                f"| {'yes' if ok else 'NO'} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
