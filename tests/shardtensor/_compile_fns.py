"""Rank functions: compiled (torch.compile, compile_local) vs eager ShardTensor vs one process.

Compilation is slow, so one compiled model per variant serves every layout of a run."""

from __future__ import annotations

import torch
from torch import nn

BACKEND = "aot_eager"  # dynamo + AOTAutograd (what compile_local relies on), no C++ build
PLAN = ["preprocess", "blocks.*.mlp"]


def _mesh(world_size):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world_size,), mesh_dim_names=("domain",))


def _shard(full, mesh, sizes, rank, grad=False):
    """(ShardTensor, its local leaf) of ``full`` split along dim 1 with ``sizes``."""
    from meshshard.shardtensor import Shard, from_local

    off = sum(sizes[:rank])
    local = full[:, off : off + sizes[rank]].clone().requires_grad_(grad)
    return from_local(local, mesh, [Shard(1)], sizes), local


def _data(N, dims, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, N, d, generator=g) for d in dims]


def _full(t):
    from meshshard.shardtensor import ShardTensor

    return t.full_tensor().detach() if isinstance(t, ShardTensor) else t.detach()


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 2))
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, x, shift):
        return self.net(x) * self.scale + shift


class _UsesGlobalSize(nn.Module):
    def forward(self, x):
        return x / x.shape[1]


def mlp(rank, world_size, layouts):
    """compile_local on an MLP with a second (plain, grad-requiring) argument, alone and
    inside torch.compile: output, input gradient and parameter gradients per layout."""
    from meshshard.shardtensor.compile import compile_local

    mesh = _mesh(world_size)
    models = {}
    for name in ("ref", "eager", "local", "local+torch.compile"):
        torch.manual_seed(0)
        models[name] = _Mlp()
    compile_local(models["local"], backend=BACKEND)
    hook_calls = []  # the module's hooks run once per call, not again inside the local call
    models["local"].register_forward_pre_hook(lambda m, a: hook_calls.append(type(a[0])))
    compile_local(models["local+torch.compile"].net, backend=BACKEND)
    fwd = dict(models)
    fwd["local+torch.compile"] = torch.compile(models["local+torch.compile"], backend=BACKEND)
    reports = []
    for sizes in layouts:
        x, t = _data(sum(sizes), (5, 2))
        rep = {}
        for name, model in models.items():
            model.zero_grad(set_to_none=True)
            shift = torch.full((2,), 0.25, requires_grad=True)
            if name == "ref":
                xin = x.clone().requires_grad_(True)
                out = fwd[name](xin, shift)
                loss = ((out - t) ** 2).mean()
                loss.backward()
                off = sum(sizes[:rank])
                xgrad = xin.grad[:, off : off + sizes[rank]]
            else:
                sx, leaf = _shard(x, mesh, sizes, rank, grad=True)
                st, _ = _shard(t, mesh, sizes, rank)
                out = fwd[name](sx, shift)
                loss = ((out - st) ** 2).mean()
                loss.backward()
                xgrad = leaf.grad
            rep[name] = {"out": _full(out), "loss": float(loss.detach()), "x.grad": xgrad,
                         "shift.grad": shift.grad, **_grads(model)}
        reports.append(rep)
    from torch._dynamo.utils import counters

    errs = errors(rank, world_size)
    errs["hook calls"] = [t.__name__ for t in hook_calls]
    errs["graphs"] = counters["stats"]["unique_graphs"]  # compiled, not run eagerly
    return reports, errs


def errors(rank, world_size):
    """Blocks that are not local raise LocalityError on every rank; mixed layouts raise."""
    from meshshard.models.transolver import PhysicsAttention
    from meshshard.shardtensor import LayoutError
    from meshshard.shardtensor.compile import LocalityError, compile_local

    mesh = _mesh(world_size)
    (x,) = _data(8, (4,))
    sx, _ = _shard(x, mesh, (3, 5), rank)
    out = {}
    torch.manual_seed(0)
    cases = {
        "attention": (compile_local(PhysicsAttention(4, heads=1, dim_head=4, slices=2),
                                    backend=BACKEND), (sx,)),
        "global size": (compile_local(_UsesGlobalSize(), backend=BACKEND), (sx,)),
        "mixed layouts": (compile_local(_Mlp(), backend=BACKEND),
                          (_shard(_data(8, (5,))[0], mesh, (3, 5), rank)[0],
                           _shard(_data(8, (2,))[0], mesh, (4, 4), rank)[0])),
    }
    for name, (module, args) in cases.items():
        try:
            module(*args)
            out[name] = "no error"
        except (LocalityError, LayoutError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def transolver(rank, world_size, layouts):
    """The reference Transolver: eager ShardTensor, torch.compile(model) (graph breaks at every
    ShardTensor op), compile_local by a plan, and both, vs one process."""
    from meshshard.models import Transolver
    from meshshard.shardtensor.compile import compile_local_plan

    mesh = _mesh(world_size)
    models, fwd = {}, {}
    for name in ("ref", "eager", "torch.compile", "local", "local+torch.compile"):
        torch.manual_seed(0)
        models[name] = fwd[name] = Transolver(3, 2, 2, n_hidden=16, n_layers=1, heads=2,
                                              slices=4)
    for name in ("local", "local+torch.compile"):
        compile_local_plan(models[name], PLAN, backend=BACKEND)
    for name in ("torch.compile", "local+torch.compile"):
        fwd[name] = torch.compile(models[name], backend=BACKEND)
    reports = []
    for sizes in layouts:
        c, f, t = _data(sum(sizes), (3, 2, 2))
        rep = {}
        for name, model in models.items():
            model.zero_grad(set_to_none=True)
            ins = (c, f, t) if name == "ref" else [_shard(a, mesh, sizes, rank)[0]
                                                     for a in (c, f, t)]
            out = fwd[name](ins[0], ins[1])
            loss = ((out - ins[2]) ** 2).mean()
            loss.backward()
            rep[name] = {"out": _full(out), "loss": float(loss.detach()), **_grads(model)}
        reports.append(rep)
    from torch._dynamo.utils import counters

    return reports, counters["stats"]["unique_graphs"]
