"""One script for the day a GPU is lent: every hot path once, on one device, in a few minutes.

Per path (a training step forward + backward, or one op call forward + backward) it prints the
time per call, the host syncs of one call (:mod:`meshshard.testing.sync_census`), the peak
memory (CUDA: ``max_memory_allocated``; CPU: the peak resident set) and whether every tensor of
the call stayed on the device (:class:`meshshard.testing.device_guard.DeviceGuard`: ``ok``, or
the first tensor found elsewhere and the line that made it). On CUDA it also says which
attention kernel ran (the fused SDPA kernel after its self-check, or the math).

    python benchmarks/gpu_check.py                 # cuda when present, "small" sizes (< 5 min)
    python benchmarks/gpu_check.py --device cpu --size tiny   # the CPU smoke run (seconds)
    python benchmarks/gpu_check.py --json gpu_check.json      # also write the rows

It runs as a world of one (``meshshard.comm.init``: ``cpu:gloo,cuda:nccl`` on CUDA): NCCL
refuses two ranks on one GPU, so multi-rank paths (ring shifts, halo exchanges between ranks)
need two GPUs and ``torchrun`` of the tests marked ``gpu``. It needs only torch, numpy and
scipy (no pymetis, zarr or pyvista).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshshard.comm import default_device, init, shutdown
from meshshard.testing.device_guard import DeviceGuard
from meshshard.testing.sync_census import sync_census

# points (or tokens, or grid edge) per path at each size; "small" is sized for < 5 min on one GPU
SIZES = {
    "tiny": {"points": 400, "tokens": 128, "grid": 8, "hidden": 16, "repeats": 1},
    "small": {"points": 200_000, "tokens": 32_768, "grid": 48, "hidden": 128, "repeats": 5},
    "full": {"points": 1_000_000, "tokens": 131_072, "grid": 96, "hidden": 128, "repeats": 5},
}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _points(n: int, dev: torch.device, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, generator=g, dtype=dtype).to(dev)


def _rows(t: torch.Tensor, mesh, dim: int = 0, grad: bool = False):
    from torch.distributed.tensor import Shard

    from meshshard.shardtensor import from_local

    t = t.detach().requires_grad_(grad)
    return from_local(t, mesh, [Shard(dim)], [[t.shape[dim]]], validate=False)


# ----------------------------------------------------------------------------- the paths
def transolver(mesh, dev, sz):
    from meshshard.models import Transolver

    n = sz["points"]
    torch.manual_seed(0)
    model = Transolver(3, 4, 4, n_hidden=sz["hidden"], n_layers=4, heads=8, slices=32).to(dev)
    c = _rows(_points(n, dev)[None], mesh, 1)
    f = _rows(torch.randn(1, n, 4).to(dev), mesh, 1)
    t = _rows(torch.randn(1, n, 4).to(dev), mesh, 1)

    def step():
        model.zero_grad(set_to_none=True)
        ((model(c, f) - t) ** 2).mean().backward()

    return step


def attention(mesh, dev, sz):
    import torch.nn.functional as F

    L = sz["tokens"]
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    q, k, v = (_rows(torch.randn(1, 8, L, sz["hidden"] // 2).to(dev, dtype), mesh, 2, grad=True)
               for _ in range(3))

    def step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum().backward()

    return step


def knn(mesh, dev, sz):
    from meshshard import ops

    x = _rows(_points(sz["points"], dev), mesh, grad=True)

    def step():
        d, _ = ops.knn(x, 16, loop=False)
        d.sum().backward()

    return step


def radius(mesh, dev, sz):
    from meshshard import ops

    n = sz["points"]
    x = _rows(_points(n, dev), mesh, grad=True)
    r = 2.0 * (16 / (4 / 3 * math.pi * n)) ** (1 / 3)  # ~16 neighbours in the ball

    def step():
        out = ops.radius(x, r, max_num_neighbors=32)
        d = out[0] if isinstance(out, tuple) else out
        d.float().sum().backward() if d.requires_grad else None

    return step


def gather(mesh, dev, sz):
    from meshshard import ops

    n = sz["points"]
    f = _rows(torch.randn(n, sz["hidden"] // 4).to(dev), mesh, grad=True)
    g = torch.Generator().manual_seed(1)
    idx = _rows(torch.randint(0, n, (n, 8), generator=g).to(dev), mesh)

    def step():
        ops.gather_neighbors(f, idx).sum().backward()

    return step


def meshgraphnet(mesh, dev, sz):
    from meshshard.graph import GraphPlug, from_edge_index
    from meshshard.models import MeshGraphNet
    from meshshard.partition import knn_graph, partition

    n = sz["points"]
    pts = _points(n, torch.device("cpu")).numpy()
    adj = knn_graph(pts, 6).tocoo()
    ei = np.stack([adj.row, adj.col]).astype(np.int64)
    part = partition(pts, 1)
    graph = from_edge_index(part, ei)  # set-up on the host, as at load time
    plug = GraphPlug(graph, mesh, "per_layer", 4, device=dev)
    torch.manual_seed(0)
    model = MeshGraphNet(6, 4, 3, hidden=sz["hidden"] // 2, layers=4).to(dev)
    g = torch.Generator().manual_seed(2)
    x = plug.nodes(torch.randn(graph.n_owned, 6, generator=g).to(dev))
    e = plug.edges(torch.randn(graph.edge_index.shape[1], 4, generator=g).to(dev))
    w = plug.nodes(torch.randn(graph.n_owned, 3, generator=g).to(dev))

    def step():
        model.zero_grad(set_to_none=True)
        ((model(x, e, plug) - w) ** 2).mean().backward()

    return step


def domino(mesh, dev, sz):
    from torch.distributed.tensor import Replicate

    from meshshard.models.domino import DoMINO
    from meshshard.ops.domino_ops import ShardedDominoOps
    from meshshard.shardtensor import from_local

    G = sz["grid"]
    shape = (G, max(G // 2, 4), max(G // 2, 4))
    spacing = (1.0 / (shape[2] - 1), 1.0 / (shape[1] - 1), 1.0 / (shape[0] - 1))
    n = max(sz["points"] // 20, 64)
    ops = ShardedDominoOps(mesh, None, validate=False)
    torch.manual_seed(0)
    h = max(spacing)
    model = DoMINO(shape, (0.0, 0.0, 0.0), spacing, radii=(1.5 * h, 3 * h), neighbors=(16, 32),
                   local_radii=(0.5 * h, h), local_neighbors=(8, 16), point_features=3,
                   out_channels=4, hidden=sz["hidden"] // 4, ops=ops).to(dev)
    stl, pts = _rows(_points(n, dev, seed=1), mesh), _rows(_points(n, dev, seed=2), mesh)
    feats = _rows(torch.randn(n, 3).to(dev), mesh)
    sdf = from_local(torch.randn(*shape).to(dev), mesh, [Replicate()])
    t = _rows(torch.randn(n, 4).to(dev), mesh)

    def step():
        model.zero_grad(set_to_none=True)
        ((model(stl, sdf, pts, feats) - t) ** 2).mean().backward()

    return step


def unet(mesh, dev, sz):
    from meshshard.models import UNet3d

    G = sz["grid"]
    torch.manual_seed(0)
    model = UNet3d(2, 2, base=sz["hidden"] // 8, depth=3, norm="group").to(dev)
    x = _rows(torch.randn(1, 2, G, G, G).to(dev), mesh, 2)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()

    return step


def sdf(mesh, dev, sz):
    from meshshard.ops import GridLayout, ShardedSurface, grid_sdf

    # a closed box (12 outward triangles) in the middle of the grid's unit cube
    lo, hi = 0.25, 0.75
    v = np.array([[x, y, z] for x in (lo, hi) for y in (lo, hi) for z in (lo, hi)])
    faces = [(0, 1, 3), (0, 3, 2), (4, 6, 7), (4, 7, 5), (0, 4, 5), (0, 5, 1),
             (2, 3, 7), (2, 7, 6), (0, 2, 6), (0, 6, 4), (1, 5, 7), (1, 7, 3)]
    tri = torch.from_numpy(v[np.array(faces)]).to(dev)
    G = sz["grid"]
    lay = GridLayout((G, G, G), (0.0, 0.0, 0.0), (1 / (G - 1),) * 3)
    surface = ShardedSurface(tri, group=mesh.get_group(0))

    def step():
        grid_sdf(surface, lay)

    return step


PATHS: dict[str, Callable] = {
    "transolver step": transolver, "attention (SDPA)": attention, "knn fwd+bwd": knn,
    "radius": radius, "gather fwd+bwd": gather, "meshgraphnet step (plug)": meshgraphnet,
    "domino step": domino, "unet step": unet, "grid sdf": sdf,
}


# ----------------------------------------------------------------------------- measuring
def _peak_start(dev):
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        return None
    from meshshard.testing.memory import PeakRss

    peak = PeakRss()
    peak.__enter__()
    return peak


def _peak_end(dev, peak) -> float:
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**20
    peak.__exit__(None, None, None)
    return peak.peak / 2**20


def measure(name: str, make: Callable, mesh, dev, sz) -> dict:
    row: dict = {"path": name}
    try:
        step = make(mesh, dev, sz)
        step()  # warm: caches, kernels, the attention self-check
        _sync(dev)
        with sync_census() as census:
            step()
        _sync(dev)
        row["host_syncs"] = census.total
        row["sync_lines"] = dict(list(census.by_line().items())[:5])
        try:
            with DeviceGuard(dev):
                step()
            row["on_device"] = "ok"
        except Exception as exc:  # the first tensor elsewhere, and where it was made
            row["on_device"] = str(exc).splitlines()[0][:200]
        peak = _peak_start(dev)
        t0 = time.perf_counter()
        for _ in range(sz["repeats"]):
            step()
        _sync(dev)
        row["ms"] = 1000 * (time.perf_counter() - t0) / sz["repeats"]
        row["peak_mib"] = _peak_end(dev, peak)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        row["trace"] = traceback.format_exc(limit=-4)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    ap.add_argument("--size", choices=sorted(SIZES), default=None,
                    help="problem sizes (default: small on CUDA, tiny on the CPU)")
    ap.add_argument("--paths", nargs="*", default=None, help=f"subset of {list(PATHS)}")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    dev = torch.device(args.device) if args.device else default_device()
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    sz = SIZES[args.size or ("small" if dev.type == "cuda" else "tiny")]
    init("gloo" if dev.type == "cpu" else None)
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(dev.type, (1,))
    names = args.paths or list(PATHS)
    unknown = [n for n in names if n not in PATHS]
    if unknown:
        print(f"gpu_check: error: unknown paths {unknown}; choose from {list(PATHS)}",
              file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"device {dev} ({name}), torch {torch.__version__}, sizes {sz}", flush=True)
    rows = []
    t_all = time.perf_counter()
    print(f"{'path':28s} {'ms/call':>10s} {'syncs':>6s} {'peak MiB':>9s}  on device", flush=True)
    for n in names:
        row = measure(n, PATHS[n], mesh, dev, sz)
        rows.append(row)
        if "error" in row:
            print(f"{n:28s} FAILED: {row['error']}", flush=True)
            continue
        print(f"{n:28s} {row['ms']:10.1f} {row['host_syncs']:6d} {row['peak_mib']:9.1f}  "
              f"{row['on_device']}", flush=True)
    if dev.type == "cuda":
        from meshshard.shardtensor._aten.attention_block import fused_kernel_report

        print(f"attention kernels (True: fused SDPA): {fused_kernel_report()}")
    print(f"total {time.perf_counter() - t_all:.1f} s")
    if args.json is not None:
        args.json.write_text(json.dumps({"device": str(dev), "name": name, "sizes": sz,
                                         "rows": rows}, indent=1, default=str))
    shutdown()
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
