"""Rank functions for ``test_grid_conv.py``: the grid rules' per-op
oracle cases and the reference UNet3d against one process on the whole grid, fp64.

Each case returns ``{name: (sharded, reference)}``; the test compares them."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from meshshard.errors import LayoutError

_G = torch.Generator


def _split(full, dims, sizes, coord):
    out = full
    for d, s, c in zip(dims, sizes, coord):
        out = out.narrow(d, sum(s[:c]), s[c])
    return out


def _mesh(mesh_shape):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", tuple(mesh_shape))


def _shard(full, mesh, dims, sizes, grad=True):
    from torch.distributed.tensor import Shard

    from meshshard.shardtensor._aten import wrap_local

    leaf = _split(full, dims, sizes, mesh.get_coordinate()).clone().requires_grad_(grad)
    placements = [Shard(d) for d in dims]
    return wrap_local(leaf, mesh, placements, [tuple(s) for s in sizes]), leaf


# ------------------------------------------------------------------ per-op cases
def _w(*shape, seed=5):
    return torch.randn(*shape, generator=_G().manual_seed(seed), dtype=torch.float64)


def _op_list():
    """(name, fn(x, params) -> tensor or tuple, params, channels of x)."""
    w3, w5, wg = _w(4, 3, 3, 3), _w(4, 3, 5, 5, seed=6), _w(6, 1, 4, 4, seed=7)
    w4 = _w(4, 3, 4, 4, seed=13)
    wt, wt2, b = _w(3, 4, 3, 3, seed=8), _w(3, 2, 2, 2, seed=9), _w(4, seed=10)
    gn_w, gn_b = _w(3, seed=11), _w(3, seed=12)
    return [
        ("conv k3 pad1", lambda x, p: F.conv2d(x, p[0], p[1], padding=1), [w3, b], 3),
        ("conv k5 stride2 pad2", lambda x, p: F.conv2d(x, p[0], p[1], stride=2, padding=2),
         [w5, b], 3),
        ("conv k3 dilation2 pad2", lambda x, p: F.conv2d(x, p[0], None, padding=2,
                                                         dilation=2), [w3], 3),
        ("conv k4 stride2 groups3 valid", lambda x, p: F.conv2d(x, p[0], None, stride=2,
                                                                groups=3), [wg], 3),
        ("conv k4 padding same", lambda x, p: F.conv2d(x, p[0], None, padding="same"), [w4],
         3),
        ("conv_transpose k3 s2 p1 op1", lambda x, p: F.conv_transpose2d(
            x, p[0], p[1], stride=2, padding=1, output_padding=1), [wt, b], 3),
        ("conv_transpose k2 s2", lambda x, p: F.conv_transpose2d(x, p[0], None, stride=2),
         [wt2], 3),
        ("max_pool k3 s2 p1 + indices", lambda x, p: F.max_pool2d(
            x, 3, 2, 1, return_indices=True), [], 3),
        ("max_pool k2 ceil", lambda x, p: F.max_pool2d(x, 2, ceil_mode=True), [], 3),
        ("max_pool k3 s1 dilation2", lambda x, p: F.max_pool2d(x, 3, 1, 1, dilation=2), [], 3),
        ("avg_pool k3 s2 p1 exclude pad", lambda x, p: F.avg_pool2d(
            x, 3, 2, 1, count_include_pad=False), [], 3),
        ("avg_pool k2 ceil", lambda x, p: F.avg_pool2d(x, 2, ceil_mode=True), [], 3),
        ("avg_pool k3 s1 p1", lambda x, p: F.avg_pool2d(x, 3, 1, 1), [], 3),
        ("adaptive_avg_pool 4", lambda x, p: F.adaptive_avg_pool2d(x, (4, 3)), [], 3),
        ("adaptive_max_pool 4 + indices", lambda x, p: F.adaptive_max_pool2d(
            x, (4, 3), return_indices=True), [], 3),
        ("pad constant", lambda x, p: F.pad(x, (1, 2, 2, 1), value=0.5), [], 3),
        ("pad constant crop", lambda x, p: F.pad(x, (-1, 1, -2, 3)), [], 3),
        ("pad reflect", lambda x, p: F.pad(x, (2, 1, 3, 2), mode="reflect"), [], 3),
        ("pad replicate", lambda x, p: F.pad(x, (1, 3, 2, 4), mode="replicate"), [], 3),
        ("pad circular", lambda x, p: F.pad(x, (2, 1, 3, 2), mode="circular"), [], 3),
        ("interpolate nearest x2", lambda x, p: F.interpolate(x, scale_factor=2), [], 3),
        ("interpolate nearest down", lambda x, p: F.interpolate(x, size=(5, 4)), [], 3),
        ("interpolate bilinear size", lambda x, p: F.interpolate(
            x, size=(11, 13), mode="bilinear"), [], 3),
        ("interpolate bilinear x2 align", lambda x, p: F.interpolate(
            x, scale_factor=2, mode="bilinear", align_corners=True), [], 3),
        ("group_norm", lambda x, p: F.group_norm(x, 3, p[0], p[1]), [gn_w, gn_b], 3),
        ("instance_norm", lambda x, p: F.instance_norm(x, weight=p[0], bias=p[1]),
         [gn_w, gn_b], 3),
    ]


def _run_op(fn, x, params):
    out = fn(x, params)
    return out if isinstance(out, tuple) else (out,)


def op_cases(rank, world, mesh_shape, dims, sizes):
    """Every per-op case on one layout: output (and indices), input gradient, weight grads."""
    mesh = _mesh(mesh_shape)
    coord = mesh.get_coordinate()
    shape = [2, 3, 8, 7]
    for d, s in zip(dims, sizes):
        shape[d] = sum(s)
    X = torch.randn(*shape, generator=_G().manual_seed(1), dtype=torch.float64)
    res = {}
    for name, fn, params, _c in _op_list():
        ps = [p.clone().requires_grad_() for p in params]
        x, leaf = _shard(X, mesh, dims, sizes)
        outs = _run_op(fn, x, ps)
        xr = X.clone().requires_grad_()
        pr = [p.clone().requires_grad_() for p in params]
        refs = _run_op(fn, xr, pr)
        R = torch.randn(refs[0].shape, generator=_G().manual_seed(3), dtype=torch.float64)
        full = outs[0].full_tensor()
        assert full.shape == refs[0].shape, (name, full.shape, refs[0].shape)
        (full * R).sum().backward()
        (refs[0] * R).sum().backward()
        res[f"{name}: out"] = (full.detach(), refs[0].detach())
        if len(outs) > 1:
            res[f"{name}: indices"] = (outs[1].full_tensor(), refs[1])
        res[f"{name}: x.grad"] = (leaf.grad, _split(xr.grad, dims, sizes, coord))
        for k, (a, b) in enumerate(zip(ps, pr)):
            res[f"{name}: param grad {k}"] = (a.grad, b.grad)
    res.update(_batch_norm_cases(mesh, dims, sizes, X))
    return res


def _batch_norm_cases(mesh, dims, sizes, X):
    res = {}
    coord = mesh.get_coordinate()
    for training in (True, False):
        torch.manual_seed(0)
        ref = torch.nn.BatchNorm2d(3).double()
        with torch.no_grad():
            ref.weight.normal_()
            ref.bias.normal_()
            ref.running_mean.normal_()
            ref.running_var.uniform_(0.5, 2)
        bn = copy.deepcopy(ref)
        ref.train(training)
        bn.train(training)
        x, leaf = _shard(X, mesh, dims, sizes)
        xr = X.clone().requires_grad_()
        out, out_r = bn(x), ref(xr)
        R = torch.randn(out_r.shape, generator=_G().manual_seed(4), dtype=torch.float64)
        full = out.full_tensor()
        (full * R).sum().backward()
        (out_r * R).sum().backward()
        tag = f"batch_norm {'train' if training else 'eval'}"
        res[f"{tag}: out"] = (full.detach(), out_r.detach())
        res[f"{tag}: x.grad"] = (leaf.grad, _split(xr.grad, dims, sizes, coord))
        for (n, p), q in zip(bn.named_parameters(), ref.parameters()):
            res[f"{tag}: {n}.grad"] = (p.grad, q.grad)
        for (n, p), q in zip(bn.named_buffers(), ref.buffers()):
            res[f"{tag}: buffer {n}"] = (p.to(torch.float64), q.to(torch.float64))
    return res


# ------------------------------------------------------------------ the reference UNet
def unet_case(rank, world, mesh_shape, dims, sizes, norm, padding_mode="zeros"):
    """UNet3d: loss, output, every parameter gradient, the input gradient by
    ``torch.autograd.grad`` w.r.t. the sharded input, and the batch-norm buffers."""
    from meshshard.models import UNet3d

    mesh = _mesh(mesh_shape)
    torch.manual_seed(0)
    ref = UNet3d(2, 3, base=4, depth=3, norm=norm, padding_mode=padding_mode).double()
    model = copy.deepcopy(ref)
    shape = [2, 2, 8, 8, 8]
    for d, s in zip(dims, sizes):
        shape[d] = sum(s)
    X = torch.randn(*shape, generator=_G().manual_seed(1), dtype=torch.float64)
    Y = torch.randn(2, 3, *shape[2:], generator=_G().manual_seed(2), dtype=torch.float64)
    x, _ = _shard(X, mesh, dims, sizes, grad=False)
    x = x.detach().requires_grad_()  # a sharded leaf
    y, _ = _shard(Y, mesh, dims, sizes, grad=False)
    out = model(x)
    loss = ((out - y) ** 2).mean()
    params = list(model.parameters())
    gx, *gw = torch.autograd.grad(loss, [x, *params])
    xr = X.clone().requires_grad_()
    out_r = ref(xr)
    loss_r = ((out_r - Y) ** 2).mean()
    gxr, *gwr = torch.autograd.grad(loss_r, [xr, *ref.parameters()])
    res = {"loss": (loss.full_tensor().detach(), loss_r.detach()),
           "out": (out.full_tensor().detach(), out_r.detach()),
           "d loss/d x (sharded)": (gx.full_tensor(), gxr),
           "out layout = input layout": (torch.tensor(out._spec.sizes == x._spec.sizes),
                                         torch.tensor(True)),
           "weight grads are plain": (torch.tensor(all(type(g) is torch.Tensor for g in gw)),
                                      torch.tensor(True))}
    for (n, _), a, b in zip(model.named_parameters(), gw, gwr):
        res[f"grad {n}"] = (a, b)
    for (n, a), b in zip(model.named_buffers(), ref.buffers()):
        res[f"buffer {n}"] = (a.to(torch.float64), b.to(torch.float64))
    return res


def all_cases(rank, world, jobs):
    """One spawn, many cases: ``jobs`` = [(kind, args...)]."""
    out = []
    for kind, *args in jobs:
        fn = {"ops": op_cases, "unet": unet_case, "errors": error_cases}[kind]
        out.append(fn(rank, world, *args))
    return out


# ------------------------------------------------------------------ torch.compile
def compile_case(rank, world, layouts, norm="group"):
    """Plain ``torch.compile(unet)`` on the sharded input over several slab layouts:
    compilations, graph breaks, and compiled against eager (loss, x.grad, weight grads)."""
    from torch._dynamo.utils import counters

    from meshshard.models import UNet3d

    torch._dynamo.reset()
    counters.clear()
    calls = {"n": 0}

    def backend(gm, example_inputs):
        calls["n"] += 1
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    mesh = _mesh((world,))
    torch.manual_seed(0)
    # depth 2 keeps the compile time (two compilations) under a minute here; depth 3 adds
    # the same ops once more
    model = UNet3d(2, 3, base=4, depth=2, norm=norm).double()
    cm = torch.compile(model, backend=backend)
    res = []
    for sizes in layouts:
        shape = [1, 2, sum(sizes), 8, 8]
        X = torch.randn(*shape, generator=_G().manual_seed(1), dtype=torch.float64)
        pair = {}
        for name, fn in (("eager", model), ("compiled", cm)):
            model.zero_grad(set_to_none=True)
            x, leaf = _shard(X, mesh, [2], [sizes])
            loss = (fn(x) ** 2).mean()
            loss.backward()
            pair[name] = [loss.full_tensor().detach(), leaf.grad.clone(),
                          *[p.grad.clone() for p in model.parameters()]]
        res.append(pair)
    return {"per layout": res, "compiles": calls["n"],
            "graph breaks": sum(counters["graph_break"].values()),
            "break reasons": [str(k) for k in counters["graph_break"]]}


def error_cases(rank, world):
    """Layouts the rules cannot do: a clear error naming the op (never a silent gather)."""
    mesh = _mesh((world,))
    X = torch.randn(2, 4, 8, 6, generator=_G().manual_seed(1), dtype=torch.float64)
    out = {}
    probes = {
        "channel-sharded conv": ([1], [(1, 3)], lambda x: F.conv2d(x, _w(2, 4, 3, 3))),
        "adaptive pool not dividing": ([2], [(3, 5)], lambda x: F.adaptive_avg_pool2d(x, 3)),
        "an op with no rule": ([2], [(3, 5)], lambda x: torch.cummax(x, 2).values),
    }
    for name, (dims, sizes, fn) in probes.items():
        x, _ = _shard(X, mesh, dims, sizes)
        try:
            fn(x)
            out[name] = "no error"
        except (NotImplementedError, LayoutError) as e:
            out[name] = str(e)
    return out
