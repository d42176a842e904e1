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

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import geometric_start  # noqa: E402
from geometric_start import run as base_run  # noqa: E402

from meshshard.partition import hypergraph as H  # noqa: E402
from meshshard.partition.fastrefine import refine_volume_fast  # noqa: E402
from meshshard.partition.graphpart import metis_assignment  # noqa: E402
from meshshard.partition.mtk_presets import CONFIGS  # noqa: E402

# Mt-KaHyPar 1.7's deterministic_quality parameters: the library's cheaper set with the five
# changed values put back
DQ = {**CONFIGS["deterministic_quality_fast"], "r-flow-scaling": "16", "i-runs": "20",
      "c-t": "160", "r-jet-num-iterations": "8", "r-flow-max-bfs-distance": "2"}


def context(overrides, parts, log=False):
    mk = H.require_mtkahypar()
    ip = H._initializer(1)
    kv = dict(DQ)
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


if __name__ == "__main__":
    geometric_start.main(run)
