"""Rank functions: the reference Transolver, tensor-parallel on a 3-D mesh, vs one process."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _model(seed=0, heads=2, hidden=16):
    from meshshard.models import Transolver

    torch.manual_seed(seed)
    return Transolver(3, 2, 2, n_hidden=hidden, n_layers=2, heads=heads, slices=8)


def _data(B, N, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, 3, generator=g), torch.randn(B, N, 2, generator=g),
            torch.randn(B, N, 2, generator=g))


def _local_of(p, ref):
    """This rank's piece of parameter ``p`` and the matching piece of the reference ``ref``."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return p, ref
    (pl,) = p.placements
    mesh = p.device_mesh
    piece = ref.chunk(mesh.size(), dim=pl.dim)[mesh.get_local_rank()]
    return p.to_local(), piece


def transolver_tp(rank, world_size, shape, sizes, steps, submesh, compiled=False):
    """Mesh ``shape`` = (data, domain, tensor); points sharded on "domain" with ``sizes``,
    batch on "data". ``submesh``: build inputs on mesh["domain"] (as the training script does)
    instead of the 3-D mesh. ``compiled``: apply compile_sharded after the plan. Returns (tp,
    reference) pairs of outputs, losses, every parameter gradient (this rank's piece) and
    weights after ``steps`` Adam steps."""
    from torch.distributed.tensor import DTensor

    from meshshard.parallel.plans import transolver_plan
    from meshshard.parallel.tensor import init_mesh_3d, parallelize_module
    from meshshard.shardtensor import Replicate, Shard, from_local
    from tests.shardtensor._model_fns import adam_steps

    data, domain, tensor = shape
    mesh = init_mesh_3d(data, domain, tensor, device_type="cpu")
    dc, pc, _ = mesh.get_coordinate()
    N = sum(sizes)
    coords, feats, target = _data(data, N)
    ref, model = _model(), _model()
    parallelize_module(model, mesh, transolver_plan(model))
    if compiled:  # the whole TP model under plain torch.compile (aot_eager)
        model = torch.compile(model, backend="aot_eager")
    n_dt = sum(isinstance(p, DTensor) for p in model.parameters())
    w = model.blocks[0].mlp.pre.weight
    off = sum(sizes[:pc])
    sl = slice(off, off + sizes[pc])
    if submesh:
        assert data == 1
        dmesh = mesh["domain"]
        c, f, t = (from_local(a[:, sl], dmesh, [Shard(1)], sizes) for a in (coords, feats, target))
    else:
        shapes = {0: (1,) * data, 1: sizes}
        c, f, t = (from_local(a[dc : dc + 1, sl], mesh, [Shard(0), Shard(1), Replicate()],
                              shapes) for a in (coords, feats, target))
    layouts = {}
    for name in ("blocks.0.mlp.pre", "blocks.0.mlp.post", "blocks.0.attn.in_project_x"):
        def hook(m, a, o, name=name):
            layouts[name] = (tuple(str(p) for p in o.placements),
                             tuple(o.sharding_sizes(i) if isinstance(p, Shard) else None
                                   for i, p in enumerate(o.placements)))
        model.get_submodule(name).register_forward_hook(hook)
    out = model(c, f)
    out_ref = ref(coords, feats)
    report = {
        "layouts": layouts,
        "n_dtensor": n_dt,
        "local_w": tuple(w.to_local().shape),
        "full_w": tuple(w.shape),
        "out_mesh": out.device_mesh.mesh_dim_names,
        "out": (out.full_tensor().detach(), out_ref.detach()),
    }
    loss = ((out - t) ** 2).mean()
    loss_ref = ((out_ref - target) ** 2).mean()
    report["loss"] = (torch.tensor(loss.item()), loss_ref.detach())
    loss.backward()
    loss_ref.backward()
    params = list(zip(model.named_parameters(), ref.named_parameters()))
    grads = {}
    for (n, p), (_, q) in params:
        g, g_ref = _local_of(p.grad, q.grad)
        grads[n] = (g.clone(), g_ref.clone())
    report["grads"] = grads
    report["losses"] = adam_steps(model, ref, lambda: ((model(c, f) - t) ** 2).mean(),
                                  lambda: ((ref(coords, feats) - target) ** 2).mean(), steps)
    weights = {}
    for (n, p), (_, q) in params:
        a, b = _local_of(p.detach(), q.detach())
        weights[n] = (a.clone(), b.clone())
    report["weights"] = weights
    return report


def bad_plan(rank, world_size, case):
    """Apply a bad plan; return the error message (every rank must raise it), then prove the
    ranks are still in step with one all-reduce."""
    import torch.distributed as dist
    from torch import nn

    from meshshard.parallel.plans import transolver_plan
    from meshshard.parallel.tensor import (
        ColwiseParallel,
        RowwiseParallel,
        init_mesh_3d,
        parallelize_module,
    )

    mesh = init_mesh_3d(1, 2, 2, device_type="cpu")
    msg = None
    try:
        if case == "missing":
            model = _model()
            plan = {**transolver_plan(model), "blocks.*.attn.to_qkv": ColwiseParallel()}
            parallelize_module(model, mesh, plan)
        elif case == "heads":
            model = _model(heads=3, hidden=18)  # 3 heads over tensor=2
            parallelize_module(model, mesh, transolver_plan(model))
        elif case == "features":
            model = nn.Sequential(nn.Linear(4, 5), nn.GELU(), nn.Linear(5, 4))
            parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        elif case == "not_linear":
            model = _model()
            parallelize_module(model, mesh, {"blocks.0.ln1": ColwiseParallel()})
        elif case == "torch_style":
            from torch.distributed.tensor.parallel import ColwiseParallel as TorchColwise

            model = _model()
            parallelize_module(model, mesh, {"blocks.0.mlp.pre": TorchColwise()})
        elif case == "foreign_mesh":  # inputs on a mesh that is not a sub-mesh of the TP mesh
            from torch.distributed.device_mesh import init_device_mesh

            from meshshard.shardtensor import Shard, from_local

            model = _model()
            parallelize_module(model, mesh, transolver_plan(model))
            other = init_device_mesh("cpu", (4,), mesh_dim_names=("domain",))
            c, f, _ = _data(1, 8)
            c, f = (from_local(a[:, 2 * rank : 2 * rank + 2], other, [Shard(1)], (2,) * 4)
                    for a in (c, f))
            try:
                model(c, f)
            finally:  # the hooks stay balanced after the error: a good call still works
                good = _data(1, 8)[:2]
                dm = mesh["domain"]
                d = dm.get_local_rank()
                good = [from_local(a[:, 4 * d : 4 * d + 4], dm, [Shard(1)], (4, 4))
                        for a in good]
                assert model(*good).device_mesh is dm
                assert model._meshshard_tp_root["stack"] == []
        elif case == "no_tensor_dim":
            from torch.distributed.device_mesh import init_device_mesh

            m2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "domain"))
            parallelize_module(_model(), m2, transolver_plan(_model()))
    except ValueError as exc:
        msg = f"{type(exc).__name__}: {exc}"
    unchanged = case != "missing" or not any(
        type(p).__name__ == "DTensor" for p in model.parameters())
    x = torch.ones(1)
    dist.all_reduce(x)
    return {"msg": msg, "alive": int(x.item()), "unchanged": unchanged}


def count_tensor_allreduces(rank, world_size, sizes):
    """Forward all-reduces over the "tensor" group (and over "domain") for one Transolver
    forward under the plan, with inputs on mesh["domain"]."""
    from meshshard.parallel.plans import transolver_plan
    from meshshard.parallel.tensor import init_mesh_3d, parallelize_module
    from meshshard.shardtensor import Shard, from_local

    mesh = init_mesh_3d(1, 2, 2, device_type="cpu")
    pc = mesh.get_local_rank("domain")
    coords, feats, _ = _data(1, sum(sizes))
    sl = slice(sum(sizes[:pc]), sum(sizes[: pc + 1]))
    c, f = (from_local(a[:, sl], mesh["domain"], [Shard(1)], sizes) for a in (coords, feats))
    model = parallelize_module(_model(), mesh, transolver_plan(_model()))
    names = {mesh.get_group("tensor").group_name: "tensor",
             mesh.get_group("domain").group_name: "domain"}
    with _CountAllReduces(names) as seen:
        model(c, f)
    return seen


class _CountAllReduces(TorchDispatchMode):
    """Counts the functional all-reduces (what ShardTensor's rules issue) by process group,
    seen below the ShardTensor wrapper (on its local pieces)."""

    def __init__(self, names):
        super().__init__()
        self.names = names
        self.seen = {"tensor": 0, "domain": 0, "other": 0}

    def __enter__(self):
        super().__enter__()
        return self.seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from meshshard.shardtensor import ShardTensor

        if any(issubclass(t, ShardTensor) for t in types):
            return NotImplemented  # let the wrapper run its rule; its collectives come here
        if func is torch.ops._c10d_functional.all_reduce.default:
            self.seen[self.names.get(args[2], "other")] += 1
        return func(*args, **(kwargs or {}))


def transolver_tp_ddp(rank, world_size, steps):
    """2x1x2 mesh: torch DDP over "data" (after torch's ``_pre_dp_module_transform``, which
    turns DTensor parameters into local ones for DDP) + TP over "tensor"; one sample of 8
    points per data rank. Against one process on both samples (mean loss)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
    from torch.nn.parallel import DistributedDataParallel as DDP

    from meshshard.parallel.plans import transolver_plan
    from meshshard.parallel.tensor import init_mesh_3d, parallelize_module
    from meshshard.shardtensor import Shard, from_local

    mesh = init_mesh_3d(2, 1, 2, device_type="cpu")
    dc = mesh.get_local_rank("data")
    tc = mesh.get_local_rank("tensor")
    coords, feats, target = _data(2, 8)
    ref, model = _model(), _model()
    parallelize_module(model, mesh, transolver_plan(model))
    split = {n: p.placements[0].dim for n, p in model.named_parameters()
             if isinstance(p, DTensor)}
    _pre_dp_module_transform(model)
    ddp = DDP(model, process_group=mesh.get_group("data"))
    dmesh = mesh["domain"]
    c, f, t = (from_local(a[dc : dc + 1], dmesh, [Shard(1)], (8,))
               for a in (coords, feats, target))
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
    losses, grads = [], {}
    for step in range(steps):
        loss = ((ddp(c, f) - t) ** 2).mean()
        loss_ref = ((ref(coords, feats) - target) ** 2).mean()
        loss.backward()
        loss_ref.backward()
        losses.append((loss.item(), loss_ref.item()))
        if step == 0:
            refs = dict(ref.named_parameters())  # the transform re-registers: match by name
            for n, p in model.named_parameters():
                q = refs[n]
                g = q.grad if n not in split else q.grad.chunk(2, dim=split[n])[tc]
                grads[n] = (p.grad.clone(), g.clone())
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()
    return {"grads": grads, "losses": losses, "split": len(split)}


def transolver_tp_plain(rank, world_size):
    """Tensor parallelism alone (mesh 1x1x4, 4 heads) on plain tensor inputs: plain output,
    every gradient piece equal to one process."""
    from meshshard.parallel.plans import transolver_plan
    from meshshard.parallel.tensor import init_mesh_3d, parallelize_module

    mesh = init_mesh_3d(1, 1, 4, device_type="cpu")
    coords, feats, target = _data(1, 6)
    ref, model = _model(heads=4), _model(heads=4)
    parallelize_module(model, mesh, transolver_plan(model))
    out = model(coords, feats)
    out_ref = ref(coords, feats)
    ((out - target) ** 2).mean().backward()
    ((out_ref - target) ** 2).mean().backward()
    grads = {}
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        g, g_ref = _local_of(p.grad, q.grad)
        grads[n] = (g.clone(), g_ref.clone())
    return {"type": type(out).__name__, "out": (out.detach(), out_ref.detach()), "grads": grads,
            "local_w": tuple(model.blocks[0].attn.in_project_x.weight.to_local().shape)}
