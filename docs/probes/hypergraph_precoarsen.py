"""Probe (not a library feature, not linted): the issue-27 attempts recorded in
docs/hypergraph-partitioning.md, "Attempts 2026-12-03". Usage:
    PYTHONPATH=. python docs/probes/hypergraph_precoarsen.py knn 2e5 16 prof,sw_vol,sw_cut
    PYTHONPATH=. python docs/probes/hypergraph_precoarsen.py knn 2e5 16 co_1_deterministic_quality,co_1_quality
    (co_<levels>_<preset>[_m|_m2|_mv|_mv2]: METIS cut/vol start on the contracted graph, 1 or 2 V-cycles)
"""
import sys, time, os
import numpy as np, scipy.sparse as sp
from meshshard.partition import knn_graph, partition
from meshshard.partition.volrefine import communication_volume as cv
from meshshard.partition.fastrefine import refine_volume_fast
from meshshard.partition.graphpart import metis_assignment
from meshshard.partition import hypergraph as H

def T():
    return time.process_time()

def dataset(name, n):
    if name == "knn":
        pts = np.random.default_rng(0).random((n, 3)); return pts, knn_graph(pts, 8)
    from meshshard.io.geometry import cell_centres
    from meshshard.io.gmshmesh import tet_volume
    from meshshard.partition import dual_graph
    points, tets = tet_volume(n, cache_dir="/tmp/meshshard-bench")
    offsets = np.arange(0, 4 * len(tets) + 1, 4, dtype=np.int64)
    conn, types = tets.reshape(-1), np.full(len(tets), 10)
    return cell_centres(points, offsets, conn), dual_graph(cells=conn, offsets=offsets, celltypes=types)

def shared_weights(g):
    n = g.shape[0]
    a = sp.csr_matrix((np.ones(g.indices.size, np.int32), g.indices, g.indptr), shape=(n, n))
    c = a + sp.identity(n, dtype=np.int32, format="csr")
    s = (c @ c).multiply(a).tocsr()   # closed common neighbours per edge (>=2)
    s.sort_indices()
    return s

def match(g, w, rng, rounds=3):
    """heavy-edge matching by mutual best pick; returns cluster id per vertex."""
    n = g.shape[0]
    mate = np.full(n, -1, np.int64)
    indptr, ind = w.indptr.astype(np.int64), w.indices.astype(np.int64)
    key = rng.random(w.data.size)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    for _ in range(rounds):
        free = mate < 0
        ok = free[rows] & free[ind]
        val = np.where(ok, w.data + key * 0.5, -1.0)
        # best per row
        order = np.lexsort((-val, rows))
        first = order[np.r_[True, rows[order][1:] != rows[order][:-1]]]
        best = np.full(n, -1, np.int64)
        good = val[first] > 0
        best[rows[first][good]] = ind[first][good]
        v = np.flatnonzero(best >= 0)
        mut = v[best[best[v]] == v]
        mate[mut] = best[mut]
        key = rng.random(w.data.size)
    single = mate < 0
    rep = np.where(single, np.arange(n), np.minimum(np.arange(n), mate))
    _, cl = np.unique(rep, return_inverse=True)
    return cl

def coarse_graph(w, cl, nc):
    n = w.shape[0]
    p = sp.csr_matrix((np.ones(n), (cl, np.arange(n))), shape=(nc, n))
    cg = (p @ w @ p.T).tocsr()
    cg.setdiag(0); cg.eliminate_zeros(); cg.sort_indices()
    return cg

def coarse_nets(g, cl, nc):
    ptr, pins = H.nets_of(g, 1)
    n = g.shape[0]
    net = np.repeat(np.arange(n), np.diff(ptr))
    k = np.unique(net * nc + cl[pins])
    net, cp = k // nc, k % nc
    cnt = np.bincount(net, minlength=n)
    keep_net = cnt > 1
    m = keep_net[net]
    net, cp = net[m], cp[m]
    h = np.random.default_rng(1).integers(0, 2**62, nc, dtype=np.int64).astype(np.uint64)
    hv = np.zeros(n, np.uint64)
    np.add.at(hv, net, h[cp])
    ids = np.flatnonzero(keep_net)
    key = hv[ids] * np.uint64(31) + cnt[ids].astype(np.uint64)
    uk, first, wts = np.unique(key, return_index=True, return_counts=True)
    reps = ids[first]
    # pins of representatives
    sel = np.isin(net, reps)
    net2, cp2 = net[sel], cp[sel]
    _, starts = np.unique(net2, return_index=True)
    lists = np.split(cp2, starts[1:])
    # order of lists follows sorted rep ids; weights follow sorted keys -> map
    wmap = dict(zip(reps.tolist(), wts.tolist()))
    nets_w = [wmap[r] for r in np.unique(net2).tolist()]
    return lists, nets_w

def mtk(lists, nw, vw, k, preset, eps=0.03, start=None, vcycles=0):
    mk = H.require_mtkahypar(); ip = H._initializer(1)
    ctx = ip.context_from_preset(getattr(mk.PresetType, H._PRESET_NAMES[preset]))
    ctx.set_partitioning_parameters(k, eps, mk.Objective.KM1); ctx.logging = False
    hg = ip.create_hypergraph(ctx, len(vw), len(lists), lists, vw.tolist(), list(nw))
    if start is not None:
        phg = hg.create_partitioned_hypergraph(ctx, k, start.tolist())
    else:
        phg = hg.partition(ctx)
    if vcycles: phg.improve_partition(ctx, vcycles)
    return np.asarray(phg.get_partition(), np.int64)

def main():
    ds, n = sys.argv[1], int(float(sys.argv[2])); parts = [int(p) for p in sys.argv[3].split(",")]
    exps = sys.argv[4].split(",")
    pts, g = dataset(ds, n)
    print(f"# {ds} n={g.shape[0]} load {os.getloadavg()[0]:.1f}", flush=True)
    ref = {}
    for P in parts:
        c0 = T(); a = partition(pts, P, method="kaminpar", graph=g, preset="strong").assignment
        ck = T() - c0; rk = cv(g, a, P)
        c0 = T(); a = metis_assignment(g, P, objective="cut"); cm = T() - c0
        print(f"P={P} kaminpar_strong rows {rk} cpu {ck:.2f}; metis_cut cpu {cm:.2f}", flush=True)
        def rep(name, a, c):
            sizes = np.bincount(a, minlength=P)
            print(f"P={P} {name}: rows {cv(g,a,P)} ({cv(g,a,P)/rk:.3f}x) cpu {c:.2f} "
                  f"({c/ck:.2f}x K, {c/cm:.2f}x M) imb {sizes.max()/sizes.mean():.3f}", flush=True)
        for e in exps:
            c0 = T()
            if e.startswith("sw"):  # shared-neighbour weighted METIS vol (+fast)
                w = shared_weights(g)
                import pymetis
                res = pymetis.part_graph(P, adjacency=pymetis.CSRAdjacency(w.indptr.astype(np.int32), w.indices.astype(np.int32)),
                    eweights=w.data.astype(np.int64) - (1 if "m1" in e else 0) if False else w.data.astype(np.int64),
                    recursive=False, options=pymetis.Options(ufactor=30, seed=0, objtype=int(pymetis.ObjType.VOL if "vol" in e else pymetis.ObjType.CUT)))
                a = np.asarray(res.vertex_part, np.int64)
                rep(e + " raw", a, T() - c0)
                a = refine_volume_fast(g, a, P); rep(e + "+fast", a, T() - c0)
            elif e.startswith("co"):  # coarse: co_<levels>_<preset>[_m]
                _, lev, preset = e.split("_")[:3]
                w = shared_weights(g); cl = np.arange(g.shape[0]); cw = w
                rng = np.random.default_rng(0)
                for _ in range(int(lev)):
                    c2 = match(cw, cw, rng); nc = c2.max() + 1
                    cl = c2[cl]; cw = coarse_graph(cw, c2, nc)
                nc = cl.max() + 1
                vw = np.bincount(cl, minlength=nc)
                c1 = T()
                lists, nw = coarse_nets(g, cl, nc)
                c2_ = T()
                start = None
                tail = e.split("_")[-1]
                if tail.startswith("m") and tail[1:] in ("", "2", "v", "v2"):
                    import pymetis
                    cg = cw
                    res = pymetis.part_graph(P, adjacency=pymetis.CSRAdjacency(cg.indptr.astype(np.int32), cg.indices.astype(np.int32)),
                        vweights=vw.astype(np.int64), eweights=np.maximum(cg.data, 1).astype(np.int64), recursive=False,
                        options=pymetis.Options(ufactor=30, seed=0, objtype=int(
                            pymetis.ObjType.VOL if "v" in tail else pymetis.ObjType.CUT)))
                    start = np.asarray(res.vertex_part, np.int64)
                ca = mtk(lists, nw, vw, P, preset, start=start, vcycles=(2 if tail.endswith("2") else 1) if start is not None else 0)
                c3 = T()
                a = ca[cl]
                rep(e + f" raw (nc={nc}, nets={len(lists)}, cluster {c1-c0:.1f}s nets {c2_-c1:.1f}s mtk {c3-c2_:.1f}s)", a, T() - c0)
                a = refine_volume_fast(g, a, P); rep(e + "+fast", a, T() - c0)
            elif e == "prof":  # breakdown of hyp dq m1
                t = T(); ptr, pins = H.nets_of(g, 1); t1 = T()
                net_list = np.split(pins, ptr[1:-1]); t2 = T()
                mk = H.require_mtkahypar(); ip = H._initializer(1)
                ctx = ip.context_from_preset(mk.PresetType.DETERMINISTIC_QUALITY)
                ctx.set_partitioning_parameters(P, 0.03, mk.Objective.KM1); ctx.logging = False
                hg = ip.create_hypergraph(ctx, g.shape[0], len(net_list), net_list); t3 = T()
                st = metis_assignment(g, P, objective="vol"); t4 = T()
                phg = hg.create_partitioned_hypergraph(ctx, P, st.tolist()); t5 = T()
                phg.improve_partition(ctx, 1); t6 = T()
                a = np.asarray(phg.get_partition(), np.int64)
                print(f"prof: nets {t1-t:.2f} split {t2-t1:.2f} create {t3-t2:.2f} metis {t4-t3:.2f} phg {t5-t4:.2f} vcycle {t6-t5:.2f}")
                rep("dq_m1 (manual)", a, T() - c0)
main()
