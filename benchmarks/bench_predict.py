"""Peak per-rank memory and time of ``predict`` at 1M, 4M and 16M surface points, 1 and 2 ranks.

Each rank makes its own slice of a car-sized ellipsoidal surface (Fibonacci points, exact
normals; the point of global index ``i`` is the same whatever the world size), the ranks
partition it together (Hilbert, :func:`partition_distributed` + :func:`redistribute_rows`),
build the model's inputs as ``predict`` does (exact distributed kNN-8 features, global
standardisation; :func:`meshshard.apps.predict.model_inputs`) and run the Transolver chunk by
chunk (:func:`meshshard.apps.chunked.chunked_forward`, a fixed ``--chunk`` budget per rank).

Memory, per rank, from the kernel's peak resident set of the process, reset before each
phase (``/proc/self/clear_refs``; a sampler thread reading the resident set every 5 ms where
that is refused; the heap is trimmed before each phase): *working memory* of a phase = its
peak resident set minus the resident set before it minus the arrays it returns (features:
the model inputs; model: the predictions). The rank's own input arrays are in the baseline.
Targets (issue 25): the working memory (the larger of the two phases') stays within 1.2x from
1M to 16M points at a fixed chunk budget; 2 ranks take <= 0.6x one process's time at 16M.
The kNN of the feature phase is streamed (:func:`meshshard.ops.knn_chunks`), so it is bounded
by the chunk budget too.

    python benchmarks/bench_predict.py                         # 1M, 4M, 16M; 1 and 2 ranks
    python benchmarks/bench_predict.py --sizes 1e5,4e5 --ranks 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import numpy as np

from meshshard.testing.memory import peak_rss_bytes, reset_peak_rss, rss_bytes

MODEL = dict(space_dim=3, fun_dim=7, out_dim=5, n_hidden=32, n_layers=2, heads=2, slices=16)
A, B, C = 2.3, 0.95, 0.72  # semi-axes of a car-sized ellipsoid (metres)


class Peak:
    """Highest resident set while the block runs, and the start value: the kernel's own peak
    (``VmHWM``, reset at the start) where Linux allows the reset, else 5 ms samples. Samples
    alone miss short peaks, more often in a short run (a 1M-point phase has 16 times fewer
    chunk peaks to catch than a 16M one), which biases a ratio of the two."""

    def __enter__(self):
        from meshshard.partition.distributed._mem import trim_heap

        trim_heap()
        self.exact = reset_peak_rss()
        self.base = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.c0  # all threads of this rank
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_bytes(), peak_rss_bytes() if self.exact else 0)


def surface_slice(n: int, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Rows ``lo:hi`` of ``n`` Fibonacci points on the ellipsoid, with normals and areas."""
    i = np.arange(lo, hi, dtype=np.float64) + 0.5
    z = 1 - 2 * i / n
    r = np.sqrt(np.maximum(0.0, 1 - z * z))
    phi = np.pi * (3 - np.sqrt(5)) * i
    u = np.stack([r * np.cos(phi), r * np.sin(phi), z], 1)  # unit sphere
    p = u * np.array([A, B, C])
    nrm = u / np.array([A, B, C])
    nrm /= np.linalg.norm(nrm, axis=1, keepdims=True)
    area = np.full(hi - lo, 4 * np.pi * ((A * B) ** 1.6 + (A * C) ** 1.6 + (B * C) ** 1.6) ** (
        1 / 1.6) / 3 ** (1 / 1.6) / n)
    return {"surface_mesh_centers": p.astype(np.float32),
            "surface_normals": nrm.astype(np.float32), "surface_areas": area.astype(np.float32),
            "surface_fields": np.zeros((hi - lo, 0), np.float32),
            "surface_perm": np.arange(lo, hi, dtype=np.int64)}


def predict_rank(rank: int, world: int, n: int, chunk: int, knn: int, unchunked: bool,
                 mmap_threshold: int, features: str = "knn", release: bool = True) -> dict:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.apps.chunked import chunked_forward
    from meshshard.apps.inputs import SurfaceRows, _partitioned
    from meshshard.apps.predict import model_inputs
    from meshshard.models import Transolver

    if mmap_threshold:  # as meshshard predict does: big buffers are mmapped and given back
        from meshshard.pipelines._alloc import tune_allocator

        tune_allocator(mmap_threshold, mmap_threshold)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = Transolver(**MODEL).eval()
    out: dict = {"rank": rank}
    with Peak() as ph:
        rows = surface_slice(n, n * rank // world, n * (rank + 1) // world)
        moved, sizes = _partitioned(rows, mesh.get_group(), world)
        del rows
        s = SurfaceRows(moved["surface_mesh_centers"], moved["surface_normals"],
                        moved["surface_areas"], moved["surface_fields"], moved["surface_perm"],
                        sizes, {}, {}, 1.0, 1.0, "bench", "bench")
        del moved
    in_bytes = sum(a.nbytes for a in (s.centers, s.normals, s.areas, s.perm))
    m = sizes[rank]
    out["read_partition"] = {"s": ph.seconds, "cpu_s": ph.cpu, "peak_mb": ph.peak / 2**20,
                             "input_mb": in_bytes / 2**20}
    with Peak() as pf:
        if features == "knn":
            coords, feats = model_inputs(s, knn, mesh, None if unchunked else chunk,
                                         release=release)
        else:  # stand-in inputs of the same shapes: the model phase alone, at any size
            coords = torch.from_numpy(s.centers).unsqueeze(0)
            g = torch.Generator().manual_seed(rank)
            feats = torch.cat([torch.from_numpy(s.normals),
                               torch.randn(m, 4, generator=g)], dim=1).unsqueeze(0)
    f_bytes = coords.numel() * 4 + feats.numel() * 4
    out["features"] = {"s": pf.seconds, "cpu_s": pf.cpu, "peak_mb": pf.peak / 2**20,
                       "work_mb": (pf.peak - pf.base - f_bytes) / 2**20}
    with Peak() as pm, torch.no_grad():
        if unchunked:
            from meshshard.shardtensor import Shard, from_local

            c = from_local(coords[0], mesh, [Shard(0)], sharding_shapes=sizes, validate=False)
            f = from_local(feats[0], mesh, [Shard(0)], sharding_shapes=sizes, validate=False)
            y = model(c.unsqueeze(0), f.unsqueeze(0)).to_local() if world > 1 else model(
                coords, feats)
        else:
            y = chunked_forward(model, (coords, feats), max_points_per_chunk=chunk,
                                group=mesh.get_group(), release=release)
    o_bytes = y.numel() * y.element_size()
    out["model"] = {"s": pm.seconds, "cpu_s": pm.cpu, "peak_mb": pm.peak / 2**20,
                    "work_mb": (pm.peak - pm.base - o_bytes) / 2**20}
    out.update(rows=m, output_mb=o_bytes / 2**20, checksum=float(y.double().sum()))
    return out


def main(argv=None) -> int:
    from meshshard.testing import run_ranks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,4e6,16e6")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--chunk", type=int, default=1 << 16, help="points per chunk per rank")
    ap.add_argument("--knn", type=int, default=8)
    ap.add_argument("--features", choices=("knn", "synthetic"), default="knn",
                    help="knn: predict's kNN features; synthetic: stand-in inputs of the same "
                         "shapes (the model phase alone, for sizes whose kNN does not fit)")
    ap.add_argument("--unchunked", action="store_true", help="the unchunked forward instead")
    ap.add_argument("--mmap-threshold", type=int, default=0,
                    help="glibc mmap/trim threshold in bytes, as meshshard predict sets it "
                         "(0: glibc's dynamic default)")
    ap.add_argument("--no-release", action="store_true",
                    help="do not hand freed heap pages back to the OS after every chunk / kNN "
                         "round (glibc malloc_trim), as predict does by default")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    ranks = [int(r) for r in args.ranks.split(",")]
    results = []
    feat = f"kNN-{args.knn} features" if args.features == "knn" else "synthetic features"
    print(f"model {MODEL}, {feat}, mmap threshold {args.mmap_threshold or 'glibc default'}, "
          f"malloc_trim after every chunk {'off' if args.no_release else 'on'}, "
          + ("unchunked" if args.unchunked else f"chunk {args.chunk:,} points per rank"))
    print(f"{'points':>11} {'ranks':>5} {'rows/rank':>10} {'read+part s':>11} {'feat s':>7} "
          f"{'model s':>8} {'total s':>8} {'feat work MB':>12} {'model work MB':>13} "
          f"{'work MB':>8} {'peak MB':>8} {'cpu s (all ranks)':>17} {'load':>5}")
    for n in sizes:
        for w in ranks:
            t0 = time.perf_counter()
            out = run_ranks(predict_rank, w, n, args.chunk, args.knn, args.unchunked,
                            args.mmap_threshold, args.features, not args.no_release,
                            timeout=3600)
            wall = time.perf_counter() - t0
            worst = {k: max(o[k]["s"] for o in out) for k in ("read_partition", "features",
                                                               "model")}
            cpu = sum(o[k].get("cpu_s", 0.0) for o in out for k in worst)
            row = {"points": n, "ranks": w, "wall_s": wall, "per_rank": out, "seconds": worst,
                   "cpu_s": cpu, "load": os.getloadavg()[0],
                   "feat_work_mb": max(o["features"]["work_mb"] for o in out),
                   "model_work_mb": max(o["model"]["work_mb"] for o in out),
                   "work_mb": max(max(o["model"]["work_mb"], o["features"]["work_mb"])
                                  for o in out),
                   "peak_mb": max(max(o[k]["peak_mb"] for k in ("read_partition", "features",
                                                                "model")) for o in out)}
            results.append(row)
            print(f"{n:>11,} {w:>5} {max(o['rows'] for o in out):>10,} "
                  f"{worst['read_partition']:>11.1f} {worst['features']:>7.1f} "
                  f"{worst['model']:>8.1f} {sum(worst.values()):>8.1f} "
                  f"{row['feat_work_mb']:>12.0f} {row['model_work_mb']:>13.0f} "
                  f"{row['work_mb']:>8.0f} {row['peak_mb']:>8.0f} {row['cpu_s']:>17.1f} "
                  f"{row['load']:>5.1f}", flush=True)
    print("ratios:")
    for w in ranks:
        mine = [r for r in results if r["ranks"] == w]
        if len(mine) > 1:
            a, b = mine[0], mine[-1]
            print(f"  {w} rank(s), {b['points']:,} / {a['points']:,} points: working memory "
                  f"{b['work_mb'] / max(a['work_mb'], 1e-9):.2f}x (target <= 1.2x); model "
                  f"phase {b['model_work_mb'] / max(a['model_work_mb'], 1e-9):.2f}x, features "
                  f"{b['feat_work_mb'] / max(a['feat_work_mb'], 1e-9):.2f}x")
    if 1 in ranks and 2 in ranks:
        for n in sizes:
            one = next(r for r in results if r["points"] == n and r["ranks"] == 1)
            two = next(r for r in results if r["points"] == n and r["ranks"] == 2)
            t1, t2 = sum(one["seconds"].values()), sum(two["seconds"].values())
            m1, m2 = one["seconds"]["model"], two["seconds"]["model"]
            print(f"  {n:,} points: 2 ranks / 1 process time {t2 / t1:.2f}x (model phase "
                  f"{m2 / m1:.2f}x; target <= 0.6x at 16M)")
    print(f"load average at the end: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
