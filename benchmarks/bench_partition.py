"""Partition benchmark: meshshard's methods against raw pymetis on the same data.

For every size and cloud (uniform cube; car-like shell with a dense boundary layer) and every
part count, prints one markdown row per method: time, imbalance (max/mean by count), edge cut
on the symmetric kNN-8 graph, halo volume (1-ring ghost rows on that graph).

- ``morton``, ``hilbert``, ``rcb``: meshshard, time of the partition call.
- ``metis``: meshshard's METIS path, *graph build included* (``partition(method="metis")``
  builds its kNN-8 graph itself).
- ``pymetis``: ``pymetis.part_graph`` (k-way, ufactor 30, seed 0, same as meshshard) on the
  prebuilt graph; time of the METIS call only. The graph build is reported on its own line.

Usage::

    python benchmarks/bench_partition.py                       # 1e6 and 1e7 points, P = 8, 64
    python benchmarks/bench_partition.py --sizes 2e5 --parts 8 # quick
    python benchmarks/bench_partition.py --sizes 1e7 --methods morton,hilbert,rcb
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
    from meshshard.partition import Partition

    part = Partition.from_assignment(assignment, parts)
    m = part.metrics(graph=graph)
    sizes = np.asarray(m["sizes"], dtype=float)
    return float(sizes.max() / sizes.mean()), int(m["edge_cut"]), int(m["halo_volume"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="comma-separated point counts")
    ap.add_argument("--parts", default="8,64", help="comma-separated part counts")
    ap.add_argument("--clouds", default="uniform,car-shell")
    ap.add_argument("--methods", default="morton,hilbert,rcb,metis,pymetis")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import pymetis

    from meshshard.partition import knn_graph, partition

    sizes = [int(float(s)) for s in args.sizes.split(",")]
    parts_list = [int(p) for p in args.parts.split(",")]
    methods = args.methods.split(",")
    print("| cloud | N | P | method | time (s) | imbalance | edge cut (kNN-8) | halo volume |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for n in sizes:
        for cloud in args.clouds.split(","):
            pts = CLOUDS[cloud](n, np.random.default_rng(args.seed))
            t0 = time.perf_counter()
            graph = knn_graph(pts, 8)
            t_graph = time.perf_counter() - t0
            print(
                f"| {cloud} | {n:,} | - | kNN-8 graph build | {t_graph:.2f} | - | "
                f"{graph.nnz // 2:,} edges | - |",
                flush=True,
            )
            for parts in parts_list:
                for method in methods:
                    gc.collect()
                    t0 = time.perf_counter()
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
                    dt = time.perf_counter() - t0
                    imb, cut, halo = evaluate(graph, assignment, parts)
                    label = "metis (graph incl.)" if method == "metis" else method
                    print(
                        f"| {cloud} | {n:,} | {parts} | {label} | {dt:.2f} | {imb:.3f} | "
                        f"{cut:,} | {halo:,} |",
                        flush=True,
                    )
            del graph, pts
            gc.collect()


if __name__ == "__main__":
    main()
