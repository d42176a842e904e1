"""Rank functions: compile_sharded (whole model, collectives in the graph) vs one process.

Every case trains a few optimizer steps from the same initial weights on the whole data (one
process, plain torch) and on uneven shards (compile_sharded), and reports what must agree."""

from __future__ import annotations

import torch
from torch import nn

from tests.shardtensor._compile_fns import _data, _full, _mesh, _shard


class Pool(nn.Module):
    """Per-point MLP, global max and mean over the points, broadcast back: the max's gradient
    goes to the rank that holds the maximum."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        g = torch.cat([h.amax(dim=1), h.mean(dim=1)], dim=-1)
        return self.head(g)[:, None, :] + h[..., :3]


def _transolver():
    from meshshard.models import Transolver

    return Transolver(3, 2, 2, n_hidden=16, n_layers=2, heads=2, slices=4)


MODELS = {"transolver": (_transolver, (3, 2, 2)), "pool": (Pool, (4, 3))}


def train(rank, world_size, model_name, layouts, backend="aot_eager", steps=3, local_plan=()):
    """Per layout: losses of ``steps`` Adam steps, the first step's output, input gradient and
    parameter gradients, and the final parameters; for one process ("ref") and for
    compile_sharded on the shards ("compiled"), after compile_local of the submodules named by
    ``local_plan`` (traced through), and an evaluation under no_grad after the steps. Also how
    many layouts were compiled."""
    from meshshard.shardtensor import compile_local_plan, compile_sharded

    make, dims = MODELS[model_name]
    mesh = _mesh(world_size)
    torch.manual_seed(0)
    model = make()
    if local_plan:
        compile_local_plan(model, local_plan, backend="aot_eager")
    compiled = compile_sharded(model, backend=backend)
    init = {k: v.clone() for k, v in compiled.state_dict().items()}
    reports = []
    for sizes in layouts:
        data = _data(sum(sizes), dims)
        rep = {}
        # "ref64": one process in float64, the judge of the fp32 rounding floor
        for name in ("ref", "ref64", "compiled"):
            model = compiled if name == "compiled" else make()
            if name == "ref64":
                model = model.double()
            model.load_state_dict(init)
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            losses, first = [], {}
            for step in range(steps):
                opt.zero_grad(set_to_none=True)
                if name != "compiled":
                    d = [a.double() for a in data] if name == "ref64" else data
                    ins = [d[0].clone().requires_grad_(True), *d[1:]]
                    leaf = ins[0]
                else:
                    sharded = [_shard(a, mesh, sizes, rank, grad=(i == 0))
                               for i, a in enumerate(data)]
                    ins = [s for s, _ in sharded]
                    leaf = sharded[0][1]
                out = model(*ins[:-1])
                loss = ((out - ins[-1]) ** 2).mean()
                loss.backward()
                losses.append(float(loss.detach()))
                if step == 0:
                    xg = leaf.grad
                    if name != "compiled":
                        off = sum(sizes[:rank])
                        xg = xg[:, off : off + sizes[rank]]
                    first = {"out": _full(out), "x.grad": xg.clone(),
                             **{f"grad {n}": p.grad.clone()
                                for n, p in model.named_parameters()}}  # fmt: skip
                opt.step()
            with torch.no_grad():  # evaluation: a layout of its own (grad mode is in the key)
                first["eval"] = _full(model(*ins[:-1]))
            rep[name] = {"losses": losses, **first,
                         **{f"final {n}": p.detach().clone()
                            for n, p in model.named_parameters()}}  # fmt: skip
        reports.append(rep)
    return reports, len(compiled.forward.entries)


class _RankZeroFails(nn.Module):
    def forward(self, x):
        import torch.distributed as dist

        if dist.get_rank() == 0:
            raise ValueError("rank 0 cannot trace this")
        return x * 2


class _Attention(nn.Module):
    def forward(self, x):
        return torch.nn.functional.scaled_dot_product_attention(x, x, x)


def errors(rank, world_size):
    """Untraceable models raise NotTraceableError on every rank, with the cause named."""
    from meshshard.shardtensor import NotTraceableError, compile_sharded

    mesh = _mesh(world_size)
    out = {}
    (x,) = _data(8, (4,))
    sx, _ = _shard(x, mesh, (3, 5), rank)
    from meshshard.shardtensor import Shard, from_local

    off = (0, 3)[rank]
    tokens = x.reshape(1, 1, 8, 4)[:, :, off : off + (3, 5)[rank]]  # (batch, heads, tokens, dim)
    tok = from_local(tokens.clone(), mesh, [Shard(2)], (3, 5))
    for name, module, arg in (("rank 0 fails", _RankZeroFails(), sx),
                              ("ring attention", _Attention(), tok)):  # fmt: skip
        compile_sharded(module, backend="aot_eager")
        try:
            module(arg)
            out[name] = "no error"
        except NotTraceableError as exc:
            out[name] = f"NotTraceableError: {exc}"
        try:  # a second call raises the same verdict, with no new trace or collective
            module(arg)
            out[name + " again"] = "no error"
        except NotTraceableError as exc:
            out[name + " again"] = f"NotTraceableError: {exc}"
    # the backward compiles at the first backward; make rank 1's fail there
    from meshshard.shardtensor import sharded_compile

    def failing(gm, forward_nodes):
        raise RuntimeError("rank 1 cannot compile this backward")

    if rank == 1:
        sharded_compile._drop_dead_collectives = failing
    module = compile_sharded(Pool(), backend="aot_eager")
    xs, _ = _shard(x, mesh, (3, 5), rank, grad=True)
    out["forward ran"] = False
    try:
        y = module(xs)
        out["forward ran"] = True
        y.sum().backward()
        out["backward"] = "no error"
    except NotTraceableError as exc:
        out["backward"] = f"NotTraceableError: {exc}"
    try:
        compile_sharded(nn.Linear(2, 2), backend="tvm")
    except ValueError as exc:
        out["backend"] = str(exc)
    return out


def unet(rank, world_size, sizes, norm):
    """UNet3d (convs with halos, pooling, upsampling, batch or group norm with global
    statistics) compiled whole vs one process: output, input and parameter gradients, and the
    batch-norm buffers after the step."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import UNet3d
    from meshshard.shardtensor import compile_sharded
    from tests.shardtensor._grid_model_fns import _compare
    from tests.shardtensor._grid_model_fns import _shard as _grid_shard

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    ref = UNet3d(2, 3, base=4, depth=3, norm=norm, padding_mode="zeros").double()
    model = compile_sharded(copy.deepcopy(ref), backend="aot_eager")
    x = torch.randn(2, 2, sum(sizes), 8, 8, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    x_ref = x.clone().requires_grad_(True)
    leaf, xs = _grid_shard(x, mesh, [2], [sizes])
    out, out_ref = model(xs), ref(x_ref)
    return _compare(model, ref, out, out_ref, leaf, x_ref, [2], [sizes], mesh.get_coordinate())


LOCAL_PLAN = ["preprocess", "blocks.*.mlp"]
UNET_CASES = (((3, 5), "group"), ((0, 8), "batch"))


def two_rank_cases(rank, world_size, layouts):
    """Every aot_eager case on 2 ranks in one spawn (starting ranks is a large part of the
    cost): both models, compile_local blocks inside, the UNet cases, and the error cases last
    (they patch the backward compiler of rank 1)."""
    return {
        "transolver": train(rank, world_size, "transolver", layouts),
        "pool": train(rank, world_size, "pool", layouts),
        "local plan": train(rank, world_size, "transolver", [(5, 3)], "aot_eager", 2,
                            LOCAL_PLAN),
        **{("unet", sizes, norm): unet(rank, world_size, sizes, norm)
           for sizes, norm in UNET_CASES},
        "errors": errors(rank, world_size),
    }  # fmt: skip
