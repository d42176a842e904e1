"""Ghost-row benchmark (``bench_partition.py --objective volume``): what a halo refresh pays.

For each dataset (``knn``: uniform points in a cube with their symmetric kNN-8 graph; ``gmsh``:
a gmsh tet volume around a car-like body with its dual graph), each size and each part count,
one row per method: CPU time of the partition call (this process, all threads; the machine is
shared, so CPU is the fairer clock), wall time, imbalance (max part / its target), edge cut,
ghost rows of a 1-ring and a 2-ring refresh (distinct (shard, outside row) pairs), and the
ratios that the targets are stated in: ghost rows and CPU time against KaMinPar-strong's, CPU
time against METIS' (edge-cut objective). Every method gets the same prebuilt graph (its build
is not timed); the hypergraph methods build their nets inside the timed call.

Methods (``--methods``, comma-separated):

- ``hilbert``; ``metis_cut``, ``metis_vol`` (``objective="vol"``); ``metis_vol_fm``
  (``metis_vol`` + meshshard's pure-Python volume FM); ``metis_vol_fast`` (+ the vectorised
  refinement, ``refine="fast"``);
- ``kaminpar_default``, ``kaminpar_strong`` (one thread); ``kaminpar_<preset>_fast`` and
  ``_fm`` (then ``refine="fast"`` / ``"volume"``);
- ``hyp_<preset>`` for ``deterministic``, ``deterministic_quality``, ``default``, ``quality``,
  ``highest_quality`` (Mt-KaHyPar on the 1-ring refresh hypergraph, one thread);
  ``hyp_metis_v1`` (METIS vol start, one deterministic V-cycle); ``hyp_<preset>_m<K>`` (METIS
  vol start, K V-cycles of that preset); ``hyp_<preset>_fm`` (then the
  volume FM); ``hyp_<preset>_t<K>`` (K seeds, fewest ghost rows kept).
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT_METHODS = (
    "kaminpar_strong,metis_cut,metis_vol,kaminpar_default,hilbert,hyp_deterministic,"
    "hyp_deterministic_quality,hyp_default,hyp_quality,hyp_metis_v1"
)


def _kwargs(method: str, graph) -> tuple[str, dict]:
    """``(partition method, keyword arguments)`` of a benchmark method name."""
    if method == "hilbert":
        return "hilbert", {}
    if method.startswith("metis"):
        kw = {"graph": graph, "objective": "vol" if method.startswith("metis_vol") else "cut"}
        if method.endswith("_fm"):
            kw["refine"] = "volume"
        if method.endswith("_fast"):
            kw["refine"] = "fast"
        return "metis", kw
    if method.startswith("kaminpar"):
        preset, _, how = method.partition("_")[2].partition("_")
        kw = {"graph": graph, "preset": preset}
        if how:  # kaminpar_<preset>_fast / _fm: refined afterwards
            kw["refine"] = {"fast": "fast", "fm": "volume"}[how]
        return "kaminpar", kw
    if method.startswith("hyp_"):
        name = method[4:]
        kw: dict = {"graph": graph}
        if name.endswith("_fm"):
            name, kw["refine"] = name[:-3], "volume"
        head, _, tail = name.rpartition("_t")
        if head and tail.isdigit():
            name, kw["tries"] = head, int(tail)
        head, _, tail = name.rpartition("_m")
        if head and tail.isdigit():  # <preset>_m<K>: METIS vol start, K V-cycles of <preset>
            kw.update(init="metis", vcycles=int(tail), preset=head,
                      deterministic=head.startswith("deterministic"))  # fmt: skip
        elif name.startswith("metis_v"):
            kw.update(init="metis", vcycles=int(name[7:]), preset="deterministic")
        else:
            kw.update(preset=name, deterministic=name.startswith("deterministic"))
        return "hypergraph", kw
    msg = f"unknown method {method!r}"
    raise ValueError(msg)


def _dataset(name: str, n: int, seed: int, cache: Path):
    """``(coordinates, CSR graph, description)``."""
    from meshshard.partition import dual_graph, knn_graph

    if name == "knn":
        pts = np.random.default_rng(seed).random((n, 3))
        return pts, knn_graph(pts, 8), "uniform points, kNN-8"
    if name == "gmsh":
        from meshshard.io.geometry import cell_centres
        from meshshard.io.gmshmesh import tet_volume

        points, tets = tet_volume(n, cache_dir=cache)
        offsets = np.arange(0, 4 * len(tets) + 1, 4, dtype=np.int64)
        conn, types = tets.reshape(-1), np.full(len(tets), 10)  # VTK_TETRA
        centres = cell_centres(points, offsets, conn)
        return centres, dual_graph(cells=conn, offsets=offsets, celltypes=types), "gmsh tets, dual"
    msg = f"unknown dataset {name!r}: use knn or gmsh"
    raise ValueError(msg)


def volume_main(args) -> int:
    from meshshard.partition import partition
    from meshshard.partition.halo import ghost_rows
    from meshshard.partition.quality import metrics

    sizes = [int(float(s)) for s in (args.sizes or "1e6").split(",")]
    parts_list = [int(p) for p in (args.parts or "4,16,64").split(",")]
    methods = (args.methods or DEFAULT_METHODS).split(",")
    cache = Path(args.cache or Path(tempfile.gettempdir()) / "meshshard-bench")
    print(f"# ghost rows per refresh; one thread per partitioner; load average at start "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| data | N | P | method | cpu (s) | wall (s) | imbalance | edge cut | ghost rows "
          "1-ring | 2-ring | ghost vs KaMinPar-strong | cpu vs KaMinPar-strong | "
          "cpu vs METIS |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.datasets.split(","):
        for n in sizes:
            pts, graph, what = _dataset(name, n, args.seed, cache)
            label = f"{name} ({what})"
            for parts in parts_list:
                ref: dict[str, tuple[float, int]] = {}
                for method in methods:
                    gc.collect()
                    fn, kw = _kwargs(method, graph)
                    t0, c0 = time.perf_counter(), time.process_time()
                    try:
                        part = partition(pts, parts, method=fn, seed=args.seed, **kw) if fn != \
                            "hilbert" else partition(pts, parts, method=fn)  # fmt: skip
                    except ImportError as exc:
                        print(f"| {label} | {pts.shape[0]:,} | {parts} | {method} | skipped: "
                              f"{exc} |||||||||", flush=True)  # fmt: skip
                        continue
                    dt, dc = time.perf_counter() - t0, time.process_time() - c0
                    m = metrics(part, graph=graph, depths=())
                    one, two = ghost_rows(part, graph, rings=2)
                    ref.setdefault(method, (dc, one))
                    ks, mc = ref.get("kaminpar_strong"), ref.get("metis_cut")
                    vs_k = f"{one / ks[1]:.3f}x" if ks else "-"
                    cpu_k = f"{dc / max(ks[0], 1e-9):.2f}x" if ks else "-"
                    cpu_m = f"{dc / max(mc[0], 1e-9):.2f}x" if mc else "-"
                    print(f"| {label} | {pts.shape[0]:,} | {parts} | {method} | {dc:.2f} | "
                          f"{dt:.2f} | {m['imbalance']:.3f} | {m['edge_cut']:,} | {one:,} | "
                          f"{two:,} | {vs_k} | {cpu_k} | {cpu_m} |", flush=True)  # fmt: skip
            del pts, graph
            gc.collect()
    return 0
