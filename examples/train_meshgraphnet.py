"""Train a MeshGraphNet on the dual graph of a car surface, domain-parallel, under torchrun.

Rank 0 generates a DrivaerML-like run and preprocesses it into ``world`` METIS parts with the
dual graph's shards stored beside the cell fields (``meshshard preprocess --graph dual``). Each
rank then reads only its cells and its graph shard, and trains the plain-torch MeshGraphNet
with a ghost refresh before every layer (``--strategy per_layer``) or one refresh of ``L``
rings before ``L`` local layers (``--strategy once``; the rings are agreed between ranks from
the stored edges, with ``meshshard.graph.build_graph``). With ``--compare`` rank 0 also trains
the same model in one process on the whole graph and prints both loss curves.

Node and edge tensors are ShardTensors (:class:`meshshard.graph.GraphPlug`), so the loss is a
plain ``.mean()`` and the weights' gradients come out global: no ``sync_gradients``, no loss
scaling by hand.

    torchrun --standalone --nproc-per-node 2 examples/train_meshgraphnet.py --compare
    torchrun --standalone --nproc-per-node 4 examples/train_meshgraphnet.py --strategy once
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from meshshard.comm import default_device, init, shutdown
from meshshard.datasets import load_shard, make_synthetic_run
from meshshard.datasets.graphstore import load_graph_shard, surface_dual_edges
from meshshard.graph import GraphPlug, build_graph, refresh_ghosts
from meshshard.models import FullGraph, MeshGraphNet
from meshshard.partition import Partition
from meshshard.partition.record import shard_labels
from meshshard.pipelines import process_run

KEYS = ["surface_mesh_centers", "surface_normals", "surface_fields"]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=20_000, help="surface cells of the car")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reduce", default="sum", choices=["sum", "mean", "max"])
    ap.add_argument("--strategy", default="per_layer", choices=["per_layer", "once"])
    ap.add_argument("--method", default="metis", choices=["metis", "hilbert"])
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--workdir", type=Path, help="where the run and store go (default: temp)")
    ap.add_argument("--compare", action="store_true", help="rank 0 also trains in one process")
    ap.add_argument("--device", default=None,
                    help="cpu or cuda (default: cuda when present; each rank its LOCAL_RANK GPU)")
    return ap.parse_args()


def edge_features(pos: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    rel = pos[edge_index[1]] - pos[edge_index[0]]
    return torch.cat([rel, rel.norm(dim=1, keepdim=True)], dim=1)


def train(model, x, edge_attr, target, plug, steps, lr) -> list[float]:
    """Adam on the mean squared error. With ShardTensors (``GraphPlug``) the mean is the global
    one and every weight's ``.grad`` the global gradient: no gradient sync, no loss scaling."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x, edge_attr, plug) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def main() -> int:
    args = parse_args()
    device = torch.device(args.device or default_device())
    rank, world = init("gloo" if device.type == "cpu" else None)  # cuda: cpu:gloo,cuda:nccl
    if device.type == "cuda":
        device = default_device()  # this rank's GPU
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory() if rank == 0 else None
        root = [tmp.name if tmp else None]
        dist.broadcast_object_list(root, src=0)
        workdir = Path(root[0])
    else:
        workdir = args.workdir
    store = workdir / "stores" / "run_1.zarr"
    if rank == 0:  # 1. data: a generated run, preprocessed with its dual-graph shards
        t = time.perf_counter()
        make_synthetic_run(workdir / "raw", 1, surface_cells=args.cells, volume_cells=0)
        res = process_run(workdir / "raw" / "run_1", workdir / "stores", parts=world,
                          method=args.method, volume=False, graph="dual",
                          overwrite=True)  # fmt: skip
        print(f"preprocessed {args.cells} cells into {world} parts ({args.method}, dual graph) "
              f"in {time.perf_counter() - t:.1f} s -> {res.path}", flush=True)  # fmt: skip
    dist.barrier()

    # 2. this rank's cells and graph shard only
    data = {k: v.to(device) for k, v in load_shard(store, rank, world, keys=KEYS).items()}
    graph = load_graph_shard(store, rank, world)
    if args.strategy == "once":  # L rings, agreed with the owners from the stored owned edges
        ei = graph.edge_index[:, : graph.n_owned_edges].numpy()
        ident = Partition(shard_labels(graph.sizes), np.arange(graph.num_nodes), graph.sizes)
        graph = build_graph(ident, graph.nodes[ei[0]], graph.nodes[ei[1]],
                            edge_ids=graph.edge_ids[: graph.n_owned_edges],
                            rings=args.layers)  # fmt: skip
    n_total = int(graph.sizes.sum())
    graph = graph.to(device)
    mesh = init_device_mesh(device.type, (world,))
    plug = GraphPlug(graph, mesh, args.strategy, args.layers, device=device)
    with torch.no_grad():  # input features: plain local data, wrapped once
        pos = refresh_ghosts(data["surface_mesh_centers"] / 4.0, graph)
        x = plug.nodes(torch.cat([data["surface_mesh_centers"] / 4.0, data["surface_normals"]],
                                 dim=1))
        target = plug.nodes(data["surface_fields"])
        edge_attr = plug.edges(edge_features(pos, graph.edge_index))
    torch.manual_seed(0)
    model = MeshGraphNet(6, 4, target.shape[1], hidden=args.hidden, layers=args.layers,
                         aggr=args.reduce).to(device)  # fmt: skip
    t = time.perf_counter()
    cpu = time.process_time()
    losses = train(model, x, edge_attr, target, plug, args.steps, args.lr)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    moved = [0] * world
    dist.all_gather_object(moved, (graph.n_owned, graph.n_ghost, plug.refreshes // args.steps))
    if rank == 0:
        print(f"{world} rank(s), {args.strategy}: owned/ghost/refreshes per step {moved}")
        print(f"{args.steps} steps in {wall:.2f} s wall, {cpu:.2f} s CPU (rank 0)")

    # 3. the same model in one process on the whole graph (rank 0)
    if rank == 0 and args.compare:
        whole = load_shard(store, 0, 1, keys=[*KEYS, "surface_perm"])
        perm = whole["surface_perm"].numpy()  # stored row -> source cell
        edges = surface_dual_edges(workdir / "raw" / "run_1", np.sort(perm))
        stored_row = np.argsort(perm, kind="stable")  # k-th kept source cell -> stored row
        ei = torch.from_numpy(stored_row[edges])
        xs = torch.cat([whole["surface_mesh_centers"] / 4.0, whole["surface_normals"]], dim=1)
        torch.manual_seed(0)
        ref = MeshGraphNet(6, 4, target.shape[1], hidden=args.hidden, layers=args.layers,
                           aggr=args.reduce)  # fmt: skip
        full = FullGraph(ei, n_total)
        ea = edge_features(whole["surface_mesh_centers"] / 4.0, ei)
        t = time.perf_counter()
        ref_losses = train(ref, xs, ea, whole["surface_fields"], full, args.steps, args.lr)
        ref_wall = time.perf_counter() - t
        print("step  loss (sharded)  loss (one process)  rel. diff")
        rel = [abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)]
        for i, (a, b, r) in enumerate(zip(losses, ref_losses, rel)):
            print(f"{i:4d}  {a:14.6f}  {b:18.6f}  {r:9.2e}")
        print(f"one process: {args.steps} steps in {ref_wall:.2f} s wall")
        print(f"max relative difference {max(rel):.3e}")
    elif rank == 0:
        for i, a in enumerate(losses):
            print(f"step {i:4d}  loss {a:.6f}")
    dist.barrier()
    if tmp is not None:
        tmp.cleanup()
    shutdown(exit_code=0)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
