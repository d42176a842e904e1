"""Rank functions: the reference UNet3d and ViT on sharded grids vs one process."""

from __future__ import annotations

import copy

import torch


def _split(full, dims, sizes, coord):
    out = full
    for d, s, c in zip(dims, sizes, coord):
        out = out.narrow(d, sum(s[:c]), s[c])
    return out


def _shard(full, mesh, dims, sizes):
    from meshshard.shardtensor import Shard, from_local

    coord = mesh.get_coordinate()
    leaf = _split(full, dims, sizes, coord).clone().requires_grad_(True)
    return leaf, from_local(leaf, mesh, [Shard(d) for d in dims], [list(s) for s in sizes])


def _compare(model, ref, out, out_ref, leaf, x_ref, dims, sizes, coord, train_steps=0):
    report = {"out": (out.full_tensor().detach(), out_ref.detach())}
    R = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(9), dtype=out_ref.dtype)
    (out.full_tensor() * R).sum().backward()
    (out_ref * R).sum().backward()
    report["x.grad"] = (leaf.grad.clone(), _split(x_ref.grad, dims, sizes, coord).clone())
    report["grads"] = {}
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        if q.grad is None:  # unused here (the attention path of the partial ViT run)
            report["grads"][n] = (torch.tensor(p.grad is None), torch.tensor(True))
        else:
            report["grads"][n] = (p.grad.clone(), q.grad.clone())
    report["buffers"] = {n: (a.clone(), b.clone()) for (n, a), (_, b) in
                         zip(model.named_buffers(), ref.named_buffers())}
    return report


def unet(rank, world_size, mesh_shape, sizes, norm, padding_mode, dims=None):
    """UNet3d forward, input and every parameter gradient, buffers (batch norm). ``dims``:
    the tensor dim each mesh dim shards (default: spatial dims 2, 3, ...; 0 = data parallel
    over the batch)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import UNet3d

    mesh = init_device_mesh("cpu", tuple(mesh_shape))
    torch.manual_seed(0)
    ref = UNet3d(2, 3, base=4, depth=3, norm=norm, padding_mode=padding_mode).double()
    model = copy.deepcopy(ref)
    dims = list(range(2, 2 + len(sizes))) if dims is None else list(dims)
    shape = [2, 2, 8, 8, 8]
    for d, s in zip(dims, sizes):
        shape[d] = sum(s)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x_ref = x.clone().requires_grad_(True)
    leaf, xs = _shard(x, mesh, dims, sizes)
    out = model(xs)
    out_ref = ref(x_ref)
    return _compare(model, ref, out, out_ref, leaf, x_ref, dims, sizes, mesh.get_coordinate())


def vit(rank, world_size, sizes, full_attention):
    """ViT on an image sharded along its rows: the whole model when ring attention is
    available (``full_attention``), else its non-attention path (patch embed -> tokens ->
    MLP halves of the blocks -> head -> unpatchify)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import ViT

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    H = sum(sizes)
    ref = ViT(2, 2, (H, 8), patch=4, dim=16, depth=2, heads=2).double()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 2, H, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x_ref = x.clone().requires_grad_(True)
    leaf, xs = _shard(x, mesh, [2], [sizes])

    def no_attention(m, img):
        t = m.tokens(img)
        for blk in m.blocks:
            t = t + blk.mlp(blk.ln2(t))
        return m.unpatchify(m.head(m.norm(t)), img.shape[2] // m.patch, img.shape[3] // m.patch)

    f = (lambda m, img: m(img)) if full_attention else no_attention
    out = f(model, xs)
    out_ref = f(ref, x_ref)
    report = _compare(model, ref, out, out_ref, leaf, x_ref, [2], [sizes],
                      mesh.get_coordinate())
    tok = model.tokens(xs)
    report["token_layout"] = (tuple(tok.placements), tok.sharding_sizes())
    return report
