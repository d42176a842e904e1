"""Partition benchmark: meshshard's methods against raw pymetis on the same data.

For every size and cloud (uniform cube; car-like shell with a dense boundary layer) and every
part count, prints one markdown row per method: wall time, CPU time of this process (all its
threads; less sensitive than wall time to other jobs on a shared machine), imbalance (max/mean
by count), edge cut on the symmetric kNN-8 graph, halo volume (1-ring ghost rows on that graph).

- ``morton``, ``hilbert``, ``rcb``: meshshard, time of the partition call.
- ``metis``: meshshard's METIS path, *graph build included* (``partition(method="metis")``
  builds its kNN-8 graph itself).
- ``pymetis``: ``pymetis.part_graph`` (k-way, ufactor 30, seed 0, same as meshshard) on the
  prebuilt graph; time of the METIS call only. The graph build is reported on its own line.

``--objective volume`` compares the partitioners on what a halo refresh pays instead: ghost rows
(1-ring and 2-ring), edge cut, imbalance and CPU time of METIS (cut and vol), KaMinPar (default
and strong), the hypergraph method at each preset and Hilbert, on a uniform kNN-8 point set and a
gmsh tet volume (dual graph), with ratios to KaMinPar-strong and METIS in the same run
(``benchmarks/bench_volume.py``).

Usage::

    python benchmarks/bench_partition.py                       # 1e6 and 1e7 points, P = 8, 64
    python benchmarks/bench_partition.py --sizes 2e5 --parts 8 # quick
    python benchmarks/bench_partition.py --sizes 1e7 --methods morton,hilbert,rcb
    python benchmarks/bench_partition.py --objective volume --sizes 2e5 --parts 4,16
    python benchmarks/bench_partition.py --objective volume   # 1M points / 1M tets, P = 4, 16, 64
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np


def uniform_cube(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.random((n, 3))


def car_shell(n: int, rng: np.random.Generator) -> np.ndarray:
    """A car-sized superellipsoid body (4.6 x 2.0 x 1.4 m); 70 % of the points in a boundary
    layer whose distance to the body is exponential (scale 1 cm), 30 % in a graded far field."""
    u = rng.normal(size=(n, 3))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    semi = np.array([2.3, 1.0, 0.7])
    e = 4.0  # superellipsoid exponent: boxy body
    surf = np.sum(np.abs(u / semi) ** e, axis=1) ** (-1.0 / e)  # radius of the body along u
    layer = rng.random(n) < 0.7
    gap = np.where(layer, rng.exponential(0.01, n), 0.02 + 2.0 * rng.random(n) ** 2)
    return u * (surf + gap)[:, None]


CLOUDS = {"uniform": uniform_cube, "car-shell": car_shell}


def evaluate(graph, assignment: np.ndarray, parts: int) -> tuple[float, int, int]:
    from meshshard.partition import Partition, metrics

    part = Partition.from_assignment(assignment, parts)
    m = metrics(part, graph=graph)
    sizes = np.asarray(m["sizes"], dtype=float)
    return float(sizes.max() / sizes.mean()), int(m["edge_cut"]), int(m["halo_volume"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objective", choices=("cut", "volume"), default="cut",
                    help="cut: the SFC/RCB/METIS table; volume: ghost rows of every "
                    "graph/hypergraph partitioner (bench_volume.py)")  # fmt: skip
    ap.add_argument("--sizes", default=None, help="comma-separated point counts")
    ap.add_argument("--parts", default=None, help="comma-separated part counts")
    ap.add_argument("--clouds", default="uniform,car-shell")
    ap.add_argument("--datasets", default="knn,gmsh", help="--objective volume: knn, gmsh")
    ap.add_argument("--methods", default=None)
    ap.add_argument("--cache", default=None, help="where the gmsh mesh is kept (.npy)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.objective == "volume":
        from bench_volume import volume_main

        return volume_main(args)
    args.sizes = args.sizes or "1e6,1e7"
    args.parts = args.parts or "8,64"
    args.methods = args.methods or "morton,hilbert,rcb,metis,pymetis"

    import pymetis

    from meshshard.partition import knn_graph, partition

    sizes = [int(float(s)) for s in args.sizes.split(",")]
    parts_list = [int(p) for p in args.parts.split(",")]
    methods = args.methods.split(",")
    print(
        "| cloud | N | P | method | wall (s) | cpu (s) | imbalance | edge cut (kNN-8) "
        "| halo volume |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for n in sizes:
        for cloud in args.clouds.split(","):
            pts = CLOUDS[cloud](n, np.random.default_rng(args.seed))
            t0, c0 = time.perf_counter(), time.process_time()
            graph = knn_graph(pts, 8)
            t_graph, c_graph = time.perf_counter() - t0, time.process_time() - c0
            print(
                f"| {cloud} | {n:,} | - | kNN-8 graph build | {t_graph:.2f} | {c_graph:.2f} | - | "
                f"{graph.nnz // 2:,} edges | - |",
                flush=True,
            )
            for parts in parts_list:
                for method in methods:
                    gc.collect()
                    t0, c0 = time.perf_counter(), time.process_time()
                    if method == "pymetis":
                        res = pymetis.part_graph(
                            parts,
                            adjacency=pymetis.CSRAdjacency(graph.indptr, graph.indices),
                            recursive=False,
                            options=pymetis.Options(ufactor=30, seed=0),
                        )
                        assignment = np.asarray(res.vertex_part, dtype=np.int64)
                    else:
                        assignment = partition(pts, parts, method=method).assignment
                    dt, dc = time.perf_counter() - t0, time.process_time() - c0
                    imb, cut, halo = evaluate(graph, assignment, parts)
                    label = "metis (graph incl.)" if method == "metis" else method
                    print(
                        f"| {cloud} | {n:,} | {parts} | {label} | {dt:.2f} | {dc:.2f} | "
                        f"{imb:.3f} | {cut:,} | {halo:,} |",
                        flush=True,
                    )
            del graph, pts
            gc.collect()


if __name__ == "__main__":
    main()
