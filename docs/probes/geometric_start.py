"""Probe (not a library feature, not linted): issue 27, geometric starts (RCB) for refine="fast"
and Mt-KaHyPar V-cycles; recorded in docs/hypergraph-partitioning.md, "Attempts 2026-12-04".
Usage:
    PYTHONPATH=. OMP_NUM_THREADS=1 python docs/probes/geometric_start.py knn 2e5 4,16,64 \
        kaminpar_strong,metis_cut,metis_vol_fast,rcb,rcb_fast,rcb_deterministic_1,rcb_deterministic_1_fast
Methods: kaminpar_strong, metis_cut, metis_vol, metis_vol_fast, strong_rows, rcb, rcb_fast,
ms (cube multi-section), ms_fast, rcb_<preset>_<K>[_fast] (RCB start, K V-cycles of the
Mt-KaHyPar preset on the 1-ring hypergraph, then optionally refine="fast"),
metis_<preset>_<K>[_fast] (same from METIS vol), kfast_<preset>_<K>[_fast] (KaMinPar fast start).
CPU = process_time of everything the method does (nets included). One thread.
"""

import os
import sys
import time

import numpy as np

from meshshard.partition import hypergraph as H
from meshshard.partition import knn_graph, partition
from meshshard.partition._validation import check_graph
from meshshard.partition.fastrefine import refine_volume_fast
from meshshard.partition.graphpart import metis_assignment
from meshshard.partition.rcb import rcb
from meshshard.partition.volrefine import communication_volume as cv


def dataset(name, n):
    # check_graph: the canonical CSR (sorted indices) the library's partition() hands METIS;
    # knn_graph's own indices are unsorted, and METIS returns a different partition on them.
    if name == "knn":
        pts = np.random.default_rng(0).random((n, 3))
        return pts, check_graph(knn_graph(pts, 8))
    from meshshard.io.geometry import cell_centres
    from meshshard.io.gmshmesh import tet_volume
    from meshshard.partition import dual_graph

    points, tets = tet_volume(n, cache_dir="/tmp/meshshard-bench")
    offsets = np.arange(0, 4 * len(tets) + 1, 4, dtype=np.int64)
    conn, types = tets.reshape(-1), np.full(len(tets), 10)
    c = cell_centres(points, offsets, conn)
    return c, check_graph(dual_graph(cells=conn, offsets=offsets, celltypes=types))


def multisection(pts, parts):
    """Cube-like boxes: factor P = px*py*pz by the box extents, cut by quantiles per axis."""
    ext = pts.max(0) - pts.min(0)
    best = None
    for px in range(1, parts + 1):
        if parts % px:
            continue
        for py in range(1, parts // px + 1):
            if (parts // px) % py:
                continue
            pz = parts // px // py
            f = np.array([px, py, pz])
            side = ext / f
            score = side.max() / side.min()
            if best is None or score < best[0]:
                best = (score, f)
    f = best[1]
    a = np.zeros(len(pts), np.int64)
    idx = [np.arange(len(pts))]
    for ax in range(3):
        k = f[ax]
        new = []
        for grp in idx:
            if k == 1:
                new.append(grp)
                continue
            o = grp[np.argsort(pts[grp, ax], kind="stable")]
            new.extend(np.array_split(o, k))
        idx = new
    for p, grp in enumerate(idx):
        a[grp] = p
    return a


def hyp_improve(g, start, parts, preset, vcycles, nets):
    mk = H.require_mtkahypar()
    ip = H._initializer(1)
    ctx = ip.context_from_preset(getattr(mk.PresetType, H._PRESET_NAMES[preset]))
    ctx.set_partitioning_parameters(parts, 0.03, mk.Objective.KM1)
    ctx.logging = False
    ptr, pins = nets
    n = g.shape[0]
    net_list = np.split(pins, ptr[1:-1])
    hg = ip.create_hypergraph(ctx, n, len(net_list), net_list)
    phg = hg.create_partitioned_hypergraph(ctx, parts, start.tolist())
    if vcycles:
        phg.improve_partition(ctx, int(vcycles))
    return np.asarray(phg.get_partition(), dtype=np.int64)


def run(method, pts, g, parts):
    fast = method.endswith("_fast")
    base = method[:-5] if fast else method
    if method == "kaminpar_strong":
        return partition(pts, parts, method="kaminpar", graph=g, preset="strong").assignment
    if method == "kaminpar_fast":
        return partition(pts, parts, method="kaminpar", graph=g, preset="fast").assignment
    if method == "strong_rows":
        return partition(pts, parts, method="kaminpar", graph=g, preset="strong_rows").assignment
    if method == "metis_cut":
        return metis_assignment(g, parts, objective="cut")
    if base == "metis_vol":
        a = metis_assignment(g, parts, objective="vol")
    elif base == "rcb":
        a = rcb(pts, parts).assignment
    elif base == "ms":
        a = multisection(pts, parts)
    else:
        words = base.split("_")
        start, preset, k = words[0], "_".join(words[1:-1]), int(words[-1])
        if start == "rcb":
            a0 = rcb(pts, parts).assignment
        elif start == "metis":
            a0 = metis_assignment(g, parts, objective="vol")
        elif start == "kfast":
            a0 = partition(pts, parts, method="kaminpar", graph=g, preset="fast").assignment
        elif start == "rcbf":  # RCB + fast, then V-cycles
            a0 = refine_volume_fast(g, rcb(pts, parts).assignment, parts, ufactor=30)
        else:
            raise ValueError(method)
        a = hyp_improve(g, a0, parts, preset, k, H.nets_of(g, 1))
    if fast:
        a = refine_volume_fast(g, a, parts, ufactor=30)
    return a


def main(run=run):
    """The rows of ``run(method, points, graph, parts)`` for the command line's cases."""
    name, n = sys.argv[1], int(float(sys.argv[2]))
    parts_list = [int(p) for p in sys.argv[3].split(",")]
    methods = sys.argv[4].split(",")
    pts, g = dataset(name, n)
    print(f"# {name} n={pts.shape[0]} load {os.getloadavg()}", flush=True)
    for parts in parts_list:
        ref = {}
        for m in methods:
            c0 = time.process_time()
            a = run(m, pts, g, parts)
            dc = time.process_time() - c0
            rows = cv(g, a, parts)
            sz = np.bincount(a, minlength=parts)
            ref.setdefault(m, (rows, dc))
            ks, mc = ref.get("kaminpar_strong"), ref.get("metis_cut")
            r = f"{rows / ks[0]:.3f}x" if ks else "-"
            ck = f"{dc / ks[1]:.2f}x" if ks else "-"
            cm = f"{dc / mc[1]:.2f}x" if mc else "-"
            print(
                f"| {name} | {parts} | {m} | {rows:,} | {dc:.2f} | {sz.max() / sz.mean():.3f} "
                f"| {r} | {ck} | {cm} |",
                flush=True,
            )
    print(f"# load at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
