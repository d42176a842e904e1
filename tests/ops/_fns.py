"""Module-level rank functions for the ops tests (they must be picklable).

Each function runs many cases in one process group (spawning ranks is the slow part) and
returns plain numpy results; the tests compare them with single-process oracles.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.ops._data import cloud, layout


def _shard(case: dict, rank: int, P: int, which: str = "x"):
    sizes = case[f"{which}_sizes"]
    pts = cloud(sum(sizes), case.get("kind", "uniform"), seed=case.get("seed", 0) + (which == "y"))
    part = layout(
        pts,
        sizes if case.get("method", "slab") in ("slab", "random") else None,
        case.get("method", "slab"),
        P,
    )
    stored = part.apply(pts)
    return stored, part.split(stored)[rank]


def leaf_shards(case: dict, rank: int, P: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's shard of the case's points ``x`` and of its queries ``y`` (``None`` when the
    case has no ``y_sizes``: the points query themselves), as leaves that take a gradient."""
    x = torch.tensor(_shard(case, rank, P, "x")[1], requires_grad=True)
    if "y_sizes" not in case:
        return x, None
    return x, torch.tensor(_shard(case, rank, P, "y")[1], requires_grad=True)


def _weights(shape, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.rand(shape, generator=g, dtype=torch.float64)


def knn_cases(rank: int, P: int, cases: list[dict]) -> list[dict]:
    from meshshard.ops.functional import knn

    out = []
    for case in cases:
        x, y = leaf_shards(case, rank, P)
        d, i = knn(
            x,
            case["k"],
            y,
            loop=case.get("loop", True),
            backend=case.get("backend", "auto"),
            nboxes=case.get("nboxes", 16),
        )
        (d * _weights(d.shape, rank)).sum().backward()
        out.append(
            {
                "dist": d.detach().numpy(),
                "index": i.numpy(),
                "gx": x.grad.numpy(),
                "gy": None if y is None else y.grad.numpy(),
            }
        )
    return out


def radius_cases(rank: int, P: int, cases: list[dict]) -> list[dict]:
    from meshshard.ops.functional import radius

    out = []
    for case in cases:
        x, y = leaf_shards(case, rank, P)
        kw = dict(
            max_num_neighbors=case.get("cap"),
            loop=case.get("loop", True),
            backend=case.get("backend", "auto"),
        )
        ptr, idx, d = radius(x, case["r"], y, format="csr", **kw)
        (d * _weights(d.shape, rank)).sum().backward()
        # the padded result (capped: the static path) and its gradient, with unit weights,
        # against the CSR's with unit weights (the same pairs)
        x2 = x.detach().clone().requires_grad_()
        y2 = None if y is None else y.detach().clone().requires_grad_()
        pd, pi = radius(x2, case["r"], y2, **kw)
        torch.where(pi >= 0, pd, 0.0).sum().backward()
        x3 = x.detach().clone().requires_grad_()
        y3 = None if y is None else y.detach().clone().requires_grad_()
        radius(x3, case["r"], y3, format="csr", **kw)[2].sum().backward()
        pd = pd.detach()
        out.append(
            {
                "ptr": ptr.numpy(),
                "index": idx.numpy(),
                "dist": d.detach().numpy(),
                "gx": x.grad.numpy(),
                "gy": None if y is None else y.grad.numpy(),
                "pad_dist": pd.numpy(),
                "pad_index": pi.numpy(),
                "pad_gx": x2.grad.numpy(),
                "unit_gx": x3.grad.numpy(),
                "pad_gy": None if y is None else y2.grad.numpy(),
                "unit_gy": None if y is None else y3.grad.numpy(),
            }
        )
    return out


def graph_cases(rank: int, P: int, sizes: list[int]) -> dict:
    from meshshard.ops.functional import knn_graph, radius_graph

    _, xl = _shard({"x_sizes": sizes}, rank, P)
    x = torch.tensor(xl)
    return {
        "knn_st": knn_graph(x, 3).numpy(),
        "knn_ts_loop": knn_graph(x, 3, loop=True, flow="target_to_source").numpy(),
        "rad_st": radius_graph(x, 0.3).numpy(),
        "rad_ts_cap": radius_graph(x, 0.3, max_num_neighbors=2, flow="target_to_source").numpy(),
    }


def halo_cases(rank: int, P: int, sizes: list[int], plan_dir: str) -> dict:
    from meshshard.ops.halo import gather_neighbors, halo_exchange, scatter_to_owners
    from meshshard.partition.record import HaloPlan

    plan = HaloPlan.load(plan_dir)
    g = torch.Generator().manual_seed(rank)
    n = sizes[rank]
    N = sum(sizes)
    off = int(np.sum(sizes[:rank]))
    feats = (torch.arange(n * 2, dtype=torch.float64).reshape(n, 2) + 2 * off).requires_grad_()
    res: dict = {}
    h = halo_exchange(feats, plan)
    (h * _weights(h.shape, rank)).sum().backward()
    res["halo"], res["halo_grad"] = h.detach().numpy(), feats.grad.numpy()

    feats.grad = None
    index = torch.randint(-1, N, (5, 3), generator=g)
    index[0, 0] = -1  # padding always present
    got = gather_neighbors(feats, index)
    (got * _weights(got.shape, rank)).sum().backward()
    res["gather_index"], res["gather"] = index.numpy(), got.detach().numpy()
    res["gather_grad"] = feats.grad.numpy()

    for red in ("sum", "mean", "max"):
        vals = torch.rand((5, 3, 2), generator=g, dtype=torch.float64).requires_grad_()
        s = scatter_to_owners(vals, index, red, sizes=sizes)
        (s * _weights(s.shape, rank)).sum().backward()
        res[f"scatter_{red}"] = (vals.detach().numpy(), s.detach().numpy(), vals.grad.numpy())
    return res


def bad_inputs(rank: int, P: int) -> dict:
    """Each bad call must raise on every rank (no hang), then the group still works."""
    import torch.distributed as dist

    from meshshard.ops.functional import knn, knn_graph, radius
    from meshshard.ops.halo import gather_neighbors, halo_exchange, scatter_to_owners
    from tests.ops._data import knn_halo_plan

    plan = knn_halo_plan(np.random.default_rng(0).random((11, 3)), [5, 6])
    plan3 = knn_halo_plan(np.random.default_rng(0).random((11, 3)), [5, 3, 3])

    good = torch.rand(5 + rank, 3, dtype=torch.float64)
    bad_nan = good.clone()
    if rank == 1:
        bad_nan[0, 0] = float("nan")
        bad_nan[2, 1] = float("inf")
    calls = {
        "k0": lambda: knn(good, 0),
        "k_too_big": lambda: knn(good, 100),
        "k_loop_false": lambda: knn(good, 11, loop=False),
        "nan_one_rank": lambda: knn(bad_nan, 3),
        "int_one_rank": lambda: knn(good.long() if rank == 0 else good, 3),
        "3d_one_rank": lambda: knn(good[None] if rank == 1 else good, 3),
        "dim_mismatch_y": lambda: knn(good, 3, good[:, :2]),
        "dim_across_ranks": lambda: knn(good[:, :2] if rank == 1 else good, 3),
        "k_differs": lambda: knn(good, 2 + rank),
        "r_zero": lambda: radius(good, 0.0),
        "r_nan": lambda: radius(good, float("nan")),
        "y_nan": lambda: radius(good, 0.5, bad_nan),
        "dtype_xy": lambda: knn(good, 3, good.float()),
        "x_sizes_wrong": lambda: knn(good, 3, x_sizes=[5, 5]),
        "gather_out_of_range": lambda: gather_neighbors(
            good, torch.tensor([0, 50 if rank == 1 else 1])
        ),
        "gather_float_index": lambda: gather_neighbors(good, torch.tensor([0.0])),
        "backend": lambda: knn(good, 3, backend="faiss"),
        "nboxes": lambda: knn(good, 3, nboxes=0),
        "format": lambda: radius(good, 0.5, format="coo"),
        "cap": lambda: radius(good, 0.5, max_num_neighbors=0),
        "flow": lambda: knn_graph(good, 2, flow="up"),
        "halo_rows": lambda: halo_exchange(good if rank == 0 else good[:2], plan),
        "halo_parts": lambda: halo_exchange(good, plan3),
        "scatter_reduce": lambda: scatter_to_owners(
            good, torch.tensor([0, 1]), "min", sizes=[5, 6]
        ),
        "grad_one_rank": lambda: knn(good.clone().requires_grad_(rank == 0), 3),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = None
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    t = torch.ones(1)
    dist.all_reduce(t)
    out["still_in_sync"] = float(t)
    d, _ = knn(good, 3)
    out["good_after"] = d.shape
    return out


def shardtensor_api(rank: int, P: int, sizes: list[int], ysizes: list[int], plan_dir: str) -> dict:
    """The ShardTensor-level API: same answers as the local layer, ShardTensors out."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard import ops
    from meshshard.ops import functional as F
    from meshshard.partition.record import HaloPlan
    from meshshard.shardtensor import Replicate, Shard, ShardTensor, from_local

    mesh = init_device_mesh("cpu", (P,))
    _, xl = _shard({"x_sizes": sizes}, rank, P)
    _, yl = _shard({"x_sizes": ysizes, "seed": 7}, rank, P)
    xloc = torch.tensor(xl, requires_grad=True)
    yloc = torch.tensor(yl, requires_grad=True)
    x = from_local(xloc, mesh, [Shard(0)], sharding_shapes=sizes)
    y = from_local(yloc, mesh, [Shard(0)], sharding_shapes=ysizes)
    res: dict = {}
    d, i = ops.knn(x, 4, y)
    assert isinstance(d, ShardTensor) and isinstance(i, ShardTensor)
    res["knn_sizes"] = (d.sharding_sizes(), tuple(d.shape), tuple(i.shape))
    (d.to_local() * _weights(d.to_local().shape, rank)).sum().backward()
    res["knn"] = (d.to_local().detach().numpy(), i.to_local().numpy())
    res["knn_grad"] = (xloc.grad.numpy(), yloc.grad.numpy())
    ref_d, ref_i = F.knn(xloc.detach(), 4, yloc.detach())
    res["knn_ref"] = (ref_d.numpy(), ref_i.numpy())

    rd, ri = ops.radius(x, 0.3, max_num_neighbors=5, loop=False)
    res["radius"] = (rd.sharding_sizes(), tuple(ri.shape), ri.to_local().numpy())
    res["radius_ref"] = F.radius(xloc.detach(), 0.3, max_num_neighbors=5, loop=False)[1].numpy()
    ptr, ci, cd = ops.radius(x, 0.3, format="csr")
    res["csr"] = (ptr.numpy(), ci.sharding_sizes(), ci.to_local().numpy())
    e = ops.knn_graph(x, 3)
    res["graph"] = (e.placements, e.sharding_sizes(), e.to_local().numpy())
    res["graph_ref"] = F.knn_graph(xloc.detach(), 3).numpy()

    plan = HaloPlan.load(plan_dir)
    feats = from_local(
        xloc.detach().clone().requires_grad_(), mesh, [Shard(0)], sharding_shapes=sizes
    )
    h = ops.halo_exchange(feats, plan)
    res["halo"] = (h.sharding_sizes(), h.to_local().detach().numpy())
    idx = from_local(i.to_local(), mesh, [Shard(0)], sharding_shapes=ysizes)
    gnb = ops.gather_neighbors(feats, idx)
    res["gather"] = (gnb.sharding_sizes(), tuple(gnb.shape), gnb.to_local().detach().numpy())
    vals = from_local(
        torch.ones(ysizes[rank], 4, 1, dtype=torch.float64),
        mesh,
        [Shard(0)],
        sharding_shapes=ysizes,
    )
    sc = ops.scatter_to_owners(vals, idx, "sum", like=feats)
    res["scatter"] = (sc.sharding_sizes(), sc.to_local().numpy())
    mesh2 = init_device_mesh("cpu", (1, P))
    errors = {}
    for name, call in {
        "mixed": lambda: ops.knn(x, 2, yloc),
        "other_mesh": lambda: ops.knn(
            x,
            2,
            from_local(
                yloc.detach(), mesh2, [Replicate(), Shard(0)], sharding_shapes={1: ysizes}
            ),
        ),
        "replicate": lambda: ops.knn(
            from_local(torch.zeros(3, 3, dtype=torch.float64), mesh, [Replicate()]), 2
        ),
    }.items():
        try:
            call()
            errors[name] = None
        except Exception as exc:
            errors[name] = str(exc)
    res["errors"] = errors
    return res
