"""Probe (not a library feature, not linted): issue 27, Mt-KaHyPar's deterministic presets with
tuned parameters (a configuration file through ``Initializer.context_from_file``) on the 1-ring
hypergraph. Usage:
    PYTHONPATH=. OMP_NUM_THREADS=1 python docs/probes/mtk_tuned.py knn 2e5 16 \
        kaminpar_strong,metis_cut,dq,dq:i-runs=5,m1dq:r-flow-time-limit-factor=2
A method is <how>[:key=value[;key=value...]][+fast]: how = dq (a full partition with the
deterministic_quality parameters and the overrides), m1dq (METIS vol start, one V-cycle),
others as in geometric_start.py. CPU = process_time of everything the method does.
"""

import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from geometric_start import dataset, run as base_run  # noqa: E402

from meshshard.partition import hypergraph as H  # noqa: E402
from meshshard.partition.fastrefine import refine_volume_fast  # noqa: E402
from meshshard.partition.graphpart import metis_assignment  # noqa: E402
from meshshard.partition.volrefine import communication_volume as cv  # noqa: E402

# Mt-KaHyPar 1.7's deterministic_quality parameters (as its print_configuration reports them)
DQ = """mode=direct
preset-type=deterministic_quality
deterministic=true
maxnet-removal-factor=0.01
smallest-maxnet-threshold=50000
maxnet-ignore=1000
num-vcycles=0
s-use-localized-random-shuffle=false
s-static-balancing-work-packages=128
p-enable-community-detection=true
p-louvain-edge-weight-function=hybrid
p-max-louvain-pass-iterations=5
p-louvain-min-vertex-move-fraction=0.01
p-vertex-degree-sampling-threshold=200000
p-louvain-low-memory-contraction=true
p-num-sub-rounds=16
c-type=deterministic_multilevel_coarsener
c-use-adaptive-edge-size=false
c-resolve-swaps=true
c-min-shrink-factor=1.01
c-max-shrink-factor=2.5
c-s=1
c-t=160
c-vertex-degree-sampling-threshold=200000
c-num-sub-rounds=3
c-rating-score=heavy_edge
c-rating-heavy-node-penalty=no_penalty
c-rating-acceptance-criterion=best_prefer_unmatched
i-mode=rb
i-runs=20
i-use-adaptive-ip-runs=false
i-perform-refinement-on-best-partitions=false
i-remove-degree-zero-hns-before-ip=true
i-fm-refinement-rounds=3
i-lp-maximum-iterations=20
i-lp-initial-block-size=5
i-r-refine-until-no-improvement=false
i-r-lp-type=deterministic
i-r-lp-maximum-iterations=5
i-r-sync-lp-sub-rounds=1
i-r-lp-he-size-activation-threshold=100
i-r-sync-lp-active-nodeset=true
i-r-fm-type=do_nothing
i-population-size=64
r-refine-until-no-improvement=false
r-rebalancer-type=deterministic
r-max-det-rebalancing-rounds=0
r-det-rebalancing-deadzone=0.1
r-det-rebalancing-heavy-vertex-exclusion=1.5
r-lp-type=do_nothing
r-lp-maximum-iterations=5
r-sync-lp-sub-rounds=1
r-lp-he-size-activation-threshold=100
r-sync-lp-active-nodeset=true
r-jet-type=deterministic
r-jet-num-iterations=8
r-jet-relative-improvement-threshold=0.001
r-jet-dynamic-rounds=3
r-jet-initial-negative-gain=0.75
r-jet-final-negative-gain=0.0
r-fm-type=do_nothing
r-flow-algo=deterministic
r-flow-scaling=16
r-flow-max-num-pins=4294967295
r-flow-find-most-balanced-cut=true
r-flow-determine-distance-from-cut=true
r-flow-max-bfs-distance=2
r-flow-min-relative-improvement-per-round=0.001
r-flow-time-limit-factor=8
r-flow-skip-small-cuts=true
r-flow-skip-unpromising-blocks=true
r-flow-pierce-in-bulk=true
r-flow-process-mapping-policy=lower_bound
"""


def context(overrides, parts, log=False):
    mk = H.require_mtkahypar()
    ip = H._initializer(1)
    kv = dict(line.split("=", 1) for line in DQ.strip().splitlines())
    for item in filter(None, overrides.split(";")):
        k, v = item.split("=", 1)
        if k not in kv:
            raise KeyError(k)
        kv[k] = v
    with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as f:
        f.write("\n".join(f"{k}={v}" for k, v in kv.items()) + "\n")
    ctx = ip.context_from_file(f.name)
    os.unlink(f.name)
    ctx.set_partitioning_parameters(parts, 0.03, mk.Objective.KM1)
    ctx.logging = log
    return ip, ctx


def run(method, pts, g, parts):
    fast = method.endswith("+fast")
    base = method[:-5] if fast else method
    how, _, over = base.partition(":")
    if how not in ("dq", "m1dq", "m2dq"):
        return base_run(method, pts, g, parts)
    ip, ctx = context(over, parts, log=os.environ.get("MTK_LOG") == "1")
    ptr, pins = H.nets_of(g, 1)
    n = g.shape[0]
    hg = ip.create_hypergraph(ctx, n, n, np.split(pins, ptr[1:-1]))
    if how == "dq":
        phg = hg.partition(ctx)
    else:
        start = metis_assignment(g, parts, objective="vol")
        phg = hg.create_partitioned_hypergraph(ctx, parts, start.tolist())
        phg.improve_partition(ctx, int(how[1]))
    a = np.asarray(phg.get_partition(), dtype=np.int64)
    if fast:
        a = refine_volume_fast(g, a, parts, ufactor=30)
    return a


def main():
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
            print(f"| {name} | {parts} | {m} | {rows:,} | {dc:.2f} | {sz.max() / sz.mean():.3f} "
                  f"| {r} | {ck} | {cm} |", flush=True)
    print(f"# load at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
