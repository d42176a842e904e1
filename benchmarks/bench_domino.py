"""DoMINO, one training step (forward + backward) on 1, 2 and 4 gloo ranks (1 thread each),
and the sharded SDF against VTK's single-process implicit distance.

Step: STL points (uniform on an ellipsoid) and sampled surface points, sharded evenly in z
order (``--points-layout z``, the slab axis) or in generation order (``interleaved``: spatially
at random), the latent grid cut in slabs along D (``--layout slab``) or replicated. Per rank:
median step time (wall), bytes saved for backward (exact, ``saved_tensors_hooks``: the
activation memory) and peak RSS growth over the step. Ratios are against the 1-rank run of the
same script (the plain-torch path: LocalOps when ranks = 1).

SDF: a closed triangulated ellipsoid of ``--triangles`` triangles; distances at every node of
the grid; meshshard on 1 and 2 ranks (triangles sharded) vs ``vtkImplicitPolyDataDistance``.

Targets (issue 24): activation memory per rank <= 1.25/P of one process; 2 ranks <= 0.65x the
one-process step time; SDF at 2 ranks faster than VTK.

    python benchmarks/bench_domino.py --grid 32 16 16 --stl 20000 --points 4096
    python benchmarks/bench_domino.py --grid 128 64 64 --stl 300000 --points 8192   # recipe
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import threading
import time

import torch

from meshshard.testing import run_ranks
from meshshard.testing.memory import saved_activation_bytes


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _PeakRss:
    def __enter__(self):
        self.base = self.peak = _rss_mb()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def _ellipsoid_points(n, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, 3, generator=g)
    v = v / v.norm(dim=1, keepdim=True)
    return v * torch.tensor([2.0, 0.8, 0.6])


def ellipsoid_mesh(n_tri: int) -> torch.Tensor:
    """A closed UV ellipsoid with about ``n_tri`` triangles (soup, float64)."""
    nv = max(3, int(math.sqrt(n_tri / 4)))
    nu = max(3, n_tri // (2 * nv))
    u = torch.arange(nu, dtype=torch.float64) * 2 * math.pi / nu
    v = (torch.arange(1, nv, dtype=torch.float64)) * math.pi / nv
    U, V = torch.meshgrid(u, v, indexing="ij")
    ax = torch.tensor([2.0, 0.8, 0.6], dtype=torch.float64)
    P = torch.stack([torch.cos(U) * torch.sin(V), torch.sin(U) * torch.sin(V), torch.cos(V)], -1)
    P = P * ax
    top, bot = torch.tensor([0, 0, 1.0], dtype=torch.float64) * ax, -torch.tensor(
        [0, 0, 1.0], dtype=torch.float64) * ax
    tris = []
    i1 = torch.arange(nu)
    i2 = (i1 + 1) % nu
    for j in range(nv - 2):
        a, b, c, d = P[i1, j], P[i2, j], P[i2, j + 1], P[i1, j + 1]
        tris += [torch.stack([a, d, c], 1), torch.stack([a, c, b], 1)]
    tris.append(torch.stack([top.expand(nu, 3), P[i1, 0], P[i2, 0]], 1))
    tris.append(torch.stack([bot.expand(nu, 3), P[i2, nv - 2], P[i1, nv - 2]], 1))
    return torch.cat(tris)


def _split(n, r, p):
    return slice(n * r // p, n * (r + 1) // p)


def _shard(x, rank, world, layout):
    """This rank's rows: ``z`` cuts the points in z order (the slab axis: what a coordinate
    bisection or a slab-aligned partition gives); ``interleaved`` cuts them in generation
    order, i.e. spatially at random, so every query needs every rank."""
    if layout == "z":
        x = x[torch.argsort(x[:, 2], stable=True)]
    return x[_split(x.shape[0], rank, world)]


def step_rank(rank, world, args):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models.domino import DoMINO, LocalOps
    from meshshard.ops.domino_ops import ShardedDominoOps, allreduce_grads
    from meshshard.ops.gridpoint import GridLayout

    torch.set_num_threads(1)
    shape = tuple(args["grid"])
    lo = [-2.2, -1.0, -0.8]
    spacing = [4.4 / (shape[2] - 1), 2.0 / (shape[1] - 1), 1.6 / (shape[0] - 1)]
    D = shape[0]
    sizes = [len(range(D)[_split(D, r, world)]) for r in range(world)]
    lay = GridLayout(shape, lo, spacing, sizes=sizes if args["layout"] == "slab" else None)
    stl = _shard(_ellipsoid_points(args["stl"], 0), rank, world, args["points_layout"])
    pts = _shard(_ellipsoid_points(args["points"], 1), rank, world, args["points_layout"])
    nrm = pts / pts.norm(dim=1, keepdim=True)
    tgt = torch.randn(pts.shape[0], 4, generator=torch.Generator().manual_seed(rank))
    sdf = torch.randn(lay.local_shape(rank))
    if world == 1:
        ops = LocalOps() if args["local_ref"] else ShardedDominoOps(init_device_mesh("cpu", (1,)))
    else:
        ops = ShardedDominoOps(init_device_mesh("cpu", (world,)), lay.sizes)
    h = max(spacing)
    torch.manual_seed(0)
    m = DoMINO(shape, lo, spacing, radii=(1.5 * h, 3.0 * h), neighbors=(32, 64),
               local_radii=(0.5 * h, h), local_neighbors=(8, 16), n_neighbors=7,
               point_features=3, out_channels=4, geo_channels=8, hidden=args["hidden"],
               blocks=2, ops=ops)
    times, saved, rss = [], [], []
    for _ in range(args["steps"]):
        m.zero_grad(set_to_none=True)
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        with _PeakRss() as pk:
            out, nbytes = saved_activation_bytes(lambda: m(stl, sdf, pts, nrm))
            loss = ((out - tgt) ** 2).sum() / (args["points"] * 4)
            loss.backward()
            if world > 1:
                allreduce_grads(m)
        times.append(time.perf_counter() - t0)
        saved.append(nbytes)
        rss.append(pk.peak - pk.base)
    return {"time": statistics.median(times), "saved_mb": saved[-1] / 2**20,
            "rss_mb": max(rss)}


def sdf_rank(rank, world, tri, shape):
    from meshshard.ops.gridpoint import GridLayout
    from meshshard.ops.sdf import ShardedSurface, grid_sdf

    torch.set_num_threads(1)
    D = shape[0]
    sizes = [len(range(D)[_split(D, r, world)]) for r in range(world)]
    lay = GridLayout(shape, (-2.2, -1.0, -0.8), (4.4 / (shape[2] - 1), 2.0 / (shape[1] - 1),
                                                 1.6 / (shape[0] - 1)), sizes=sizes)
    t0 = time.perf_counter()
    surf = ShardedSurface(tri[_split(len(tri), rank, world)])
    d = grid_sdf(surf, lay, dtype=torch.float64)
    return {"time": time.perf_counter() - t0, "sdf": d.reshape(-1)}


def vtk_sdf(tri, shape):
    import numpy as np
    import pyvista as pv
    import vtk

    from meshshard.ops.gridpoint import GridLayout

    lay = GridLayout(shape, (-2.2, -1.0, -0.8), (4.4 / (shape[2] - 1), 2.0 / (shape[1] - 1),
                                                 1.6 / (shape[0] - 1)))
    pts, inv = np.unique(tri.reshape(-1, 3).numpy(), axis=0, return_inverse=True)
    faces = np.hstack([np.full((len(tri), 1), 3), inv.reshape(-1, 3)]).ravel()
    mesh = pv.PolyData(pts, faces)
    nodes = lay.local_nodes(0, torch.float64).numpy()
    t0 = time.perf_counter()
    f = vtk.vtkImplicitPolyDataDistance()
    f.SetInput(mesh)
    # the whole array in one call (vtkImplicitFunction.FunctionValue): no per-point Python
    from vtk.util.numpy_support import numpy_to_vtk, vtk_to_numpy

    src = numpy_to_vtk(np.ascontiguousarray(nodes), deep=True)
    dst = vtk.vtkDoubleArray()
    f.FunctionValue(src, dst)
    out = vtk_to_numpy(dst).copy()
    return time.perf_counter() - t0, torch.from_numpy(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=int, nargs=3, default=(32, 16, 16))
    ap.add_argument("--stl", type=int, default=20000)
    ap.add_argument("--points", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--layout", choices=("slab", "replicated"), default="slab")
    ap.add_argument("--points-layout", choices=("z", "interleaved"), default="z",
                    help="how the STL and sampled points are cut over ranks")
    ap.add_argument("--triangles", type=int, default=50000, help="SDF mesh size (0: skip)")
    ap.add_argument("--local-ref", action="store_true",
                    help="P=1 with the brute-force LocalOps (small sizes only) instead of the "
                         "kd-tree ops on a 1-rank mesh")
    ap.add_argument("--sdf-grid", type=int, nargs=3, default=(32, 16, 16))
    args = ap.parse_args(argv)
    cfg = dict(grid=args.grid, stl=args.stl, points=args.points, hidden=args.hidden,
               steps=args.steps, layout=args.layout, local_ref=args.local_ref,
               points_layout=args.points_layout)
    print(f"DoMINO step: grid {tuple(args.grid)} ({args.layout}), {args.stl} STL points "
          f"({args.points_layout}), "
          f"{args.points} surface points, hidden {args.hidden}, 1 thread per rank")
    base = None
    for p in (int(x) for x in args.ranks.split(",") if x):  # --ranks "": SDF only
        res = run_ranks(step_rank, p, cfg, timeout=1800)
        t = max(r["time"] for r in res)
        sv = max(r["saved_mb"] for r in res)
        rss = max(r["rss_mb"] for r in res)
        if base is None:
            base = (t, sv, rss)
        print(f"  P={p}: step {t:7.2f} s ({t / base[0]:.2f}x of P=1)  activations/rank "
              f"{sv:8.1f} MB ({sv / base[1]:.3f} of P=1; target <= {1.25 / p:.3f})  peak RSS "
              f"growth/rank {rss:8.1f} MB ({rss / max(base[2], 1e-9):.3f})")
    if args.triangles:
        tri = ellipsoid_mesh(args.triangles)
        shape = tuple(args.sdf_grid)
        n = int(torch.tensor(shape).prod())
        print(f"SDF: {len(tri)} triangles x {n} grid nodes")
        tv, dv = vtk_sdf(tri, shape)
        print(f"  VTK vtkImplicitPolyDataDistance (1 process): {tv:7.2f} s")
        for p in (1, 2):
            res = run_ranks(sdf_rank, p, tri, shape, timeout=1800)
            t = max(r["time"] for r in res)
            d = torch.cat([r["sdf"] for r in res])
            rel = float(((d - dv).abs() / dv.abs().clamp(min=1e-12)).max())
            signs = int((torch.sign(d) != torch.sign(dv)).sum())
            print(f"  meshshard P={p}: {t:7.2f} s ({tv / t:.2f}x faster than VTK); largest "
                  f"relative difference to VTK {rel:.1e}, {signs} sign differences")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
