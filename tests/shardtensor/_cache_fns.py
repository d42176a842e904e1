"""Rank functions for the dispatch caches (contract plans, pointwise routes, derived specs,
linear fast path): the same ops on a sequence of layouts must each equal the single-process
oracle, forward and gradients, whatever was cached by the layouts before."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _mesh(ws):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (ws,))


def _model():
    torch.manual_seed(1)
    return torch.nn.Linear(8, 6)


def _block(x, lin):
    """linear -> gelu -> reshape/permute -> pointwise with a scalar and itself -> two
    contractions over the points (Partial) -> divide by a reduced Partial."""
    y = F.gelu(lin(x))  # (1, N, 6)
    y = y.reshape(1, y.shape[1], 2, 3).permute(0, 2, 1, 3)  # (1, 2, N, 3)
    w = torch.softmax(y * 2.0 + y, dim=-1)
    z = torch.einsum("bhnd,bhns->bhsd", y, w)  # sum over points
    norm = w.sum(dim=2)
    return (z / (norm + 1e-3).unsqueeze(-1)).sum() + (y - w).pow(2).mean()


def _full(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, n, 8, generator=g)


def _run(mesh, rank, sizes, placement):
    """One pass of _block on ``sizes`` (Shard) or replicated; compare with the oracle."""
    from meshshard.shardtensor import Replicate, Shard, from_local

    n = sum(sizes)
    full = _full(n, seed=n + len(sizes))
    lin_ref = _model()
    xr = full.clone().requires_grad_(True)
    ref = _block(xr, lin_ref)
    ref.backward()
    lin = _model()
    if placement == "shard":
        off = sum(sizes[:rank])
        local = full[:, off : off + sizes[rank]].clone().requires_grad_(True)
        x = from_local(local, mesh, [Shard(1)], list(sizes))
        gref = xr.grad[:, off : off + sizes[rank]]
    else:
        local = full.clone().requires_grad_(True)
        x = from_local(local, mesh, [Replicate()])
        gref = xr.grad
    out = _block(x, lin)
    out.backward()
    val = out.full_tensor() if hasattr(out, "full_tensor") else out
    return {
        "value": torch.allclose(val, ref, atol=1e-5, rtol=1e-5),
        "x_grad": torch.allclose(local.grad, gref, atol=1e-5, rtol=1e-5),
        "w_grad": torch.allclose(lin.weight.grad, lin_ref.weight.grad, atol=1e-5, rtol=1e-5),
        "b_grad": torch.allclose(lin.bias.grad, lin_ref.bias.grad, atol=1e-5, rtol=1e-5),
    }


def layout_sequence(rank, ws, layouts):
    """Run the block on each (sizes, placement) in turn in one process, caches kept."""
    mesh = _mesh(ws)
    return [_run(mesh, rank, tuple(s), p) for s, p in layouts]


def mismatched_sizes_still_communicate(rank, ws):
    """a + b with the same sharded dim but different sizes must move rows (not reuse the
    same-layout fast path), before and after the same-size case was seen."""
    from meshshard.shardtensor import Shard, from_local

    mesh = _mesh(ws)
    full_a = torch.arange(8.0).reshape(8, 1)
    full_b = 10 * torch.arange(8.0).reshape(8, 1)
    out = []
    for sa, sb in [((3, 5), (3, 5)), ((3, 5), (6, 2)), ((3, 5), (3, 5)), ((0, 8), (5, 3))]:
        oa, ob = sum(sa[:rank]), sum(sb[:rank])
        a = from_local(full_a[oa : oa + sa[rank]], mesh, [Shard(0)], list(sa))
        b = from_local(full_b[ob : ob + sb[rank]], mesh, [Shard(0)], list(sb))
        c = a + b
        out.append((c.sharding_sizes(), torch.equal(c.full_tensor(), full_a + full_b)))
    return out


def registry_change_reroutes(rank, ws):
    """A pointwise function's cached route must give way to an aten-level handler registered
    after it was cached, and come back when the handler is removed."""
    from meshshard.shardtensor import Shard, from_local, register_handler, unregister_handler

    mesh = _mesh(ws)
    sizes = (3, 5)
    full = torch.linspace(-1, 1, 8).reshape(8, 1)
    off = sum(sizes[:rank])
    x = from_local(full[off : off + sizes[rank]], mesh, [Shard(0)], list(sizes))
    first = torch.equal(torch.sin(x).full_tensor(), torch.sin(full))
    calls = []

    def rule(t):
        calls.append(1)
        return from_local(torch.sin(t.to_local()) + 1, mesh, [Shard(0)], list(sizes),
                          validate=False)

    register_handler(torch.ops.aten.sin.default)(rule)
    try:
        during = torch.equal(torch.sin(x).full_tensor(), torch.sin(full) + 1)
    finally:
        unregister_handler(torch.ops.aten.sin.default)
    after = torch.equal(torch.sin(x).full_tensor(), torch.sin(full))
    return {"first": first, "during": during, "calls": len(calls), "after": after}


def mesh_group_memo(rank, ws):
    """mesh_group returns the mesh's own groups, per mesh dim, on a 2-d mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor.spec import mesh_group

    mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("a", "b"))
    return [mesh_group(mesh, i) is mesh.get_group(i) and mesh_group(mesh, i) is mesh_group(
        mesh, i) for i in range(2)]
