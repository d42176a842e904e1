"""Rank functions for ``test_aten_attention.py``: ``F.scaled_dot_product_attention`` and the
reference point transformer on the aten-level ShardTensor, against one process (fp64)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Shard


def _mesh(world):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


def _rows(t, sizes, rank, dim):
    return t.narrow(dim, sum(sizes[:rank]), sizes[rank])


def sdpa_cases(rank: int, world: int, sizes: tuple, kv_sizes: tuple) -> dict:
    """(got, want) per case: output and the gradients of q, k, v (and of a plain weight)."""
    from meshshard.shardtensor._aten import from_local

    mesh = _mesh(world)
    g = torch.Generator().manual_seed(sum(sizes) * 7 + sum(kv_sizes))
    n, m = sum(sizes), sum(kv_sizes)
    Q = torch.randn(2, 2, n, 4, generator=g, dtype=torch.float64)
    K = torch.randn(2, 2, m, 4, generator=g, dtype=torch.float64)
    V = torch.randn(2, 2, m, 3, generator=g, dtype=torch.float64)
    T = torch.randn(2, 2, n, 3, generator=g, dtype=torch.float64)
    M = torch.rand(n, m, generator=g) > 0.3
    M[:, 0] = True  # every query sees a key
    out: dict = {}

    def sh(t, s, dim=2):
        return from_local(_rows(t, s, rank, dim).clone(), mesh, [Shard(dim)], s) \
            .detach().requires_grad_()

    def rep(t):
        return t.clone().requires_grad_()  # a plain tensor: lifted as Replicate

    # masks sharded on their key dim (the keys' sizes, or other sizes), bool and additive
    KP = torch.rand(2, 1, 1, m, generator=g) > 0.3  # a key-padding mask, True = attend
    KP[..., 0] = True
    A = torch.randn(n, m, generator=g, dtype=torch.float64).masked_fill(~M, float("-inf"))
    other = tuple(reversed(kv_sizes))  # sums to m, split differently from the keys

    def cols(t, s):
        return from_local(_rows(t, s, rank, t.ndim - 1).clone(), mesh, [Shard(t.ndim - 1)], s)

    ring = (lambda: sh(Q, sizes), lambda: sh(K, kv_sizes), lambda: sh(V, kv_sizes))
    merge = (lambda: rep(Q), lambda: sh(K, kv_sizes), lambda: sh(V, kv_sizes))
    local = (lambda: sh(Q, sizes), lambda: rep(K), lambda: rep(V))
    cases = {
        "ring": (*ring, {}, None),
        "ring causal": (*ring, {"is_causal": True}, None),
        "ring bool mask": (*ring, {"attn_mask": M}, M),
        "ring mask sharded like the rows": (
            *ring, {"attn_mask": from_local(_rows(M, sizes, rank, 0), mesh, [Shard(0)], sizes)},
            M),
        "local (keys whole)": (*local, {}, None),
        "merge (query whole)": (*merge, {"scale": 0.3}, None),
        "ring bool key padding like the keys": (*ring, {"attn_mask": cols(KP, kv_sizes)}, KP),
        "ring key padding, other sizes": (*ring, {"attn_mask": cols(KP, other)}, KP),
        "ring additive mask on its key dim": (*ring, {"attn_mask": cols(A, kv_sizes)}, A),
        "ring bool mask on its key dim, other sizes": (*ring, {"attn_mask": cols(M, other)}, M),
        "merge key padding like the keys": (*merge, {"attn_mask": cols(KP, kv_sizes)}, KP),
        "merge additive mask like the keys": (*merge, {"attn_mask": cols(A, kv_sizes)}, A),
        "merge bool mask, other sizes": (*merge, {"attn_mask": cols(M, other)}, M),
        "local additive mask on its key dim": (*local, {"attn_mask": cols(A, kv_sizes)}, A),
        "local key padding": (*local, {"attn_mask": cols(KP, other)}, KP),
    }
    for name, (mq, mk, mv, kw, ref_mask) in cases.items():
        q, k, v = mq(), mk(), mv()
        kw_ref = dict(kw)
        if "attn_mask" in kw_ref:
            kw_ref["attn_mask"] = ref_mask
        y = F.scaled_dot_product_attention(q, k, v, **kw)
        yf = y.full_tensor() if hasattr(y, "full_tensor") else y
        loss = (yf * T).sum()
        grads = torch.autograd.grad(loss, [q, k, v])
        qr, kr, vr = (t.clone().requires_grad_() for t in (Q, K, V))
        yr = F.scaled_dot_product_attention(qr, kr, vr, **kw_ref)
        gr = torch.autograd.grad((yr * T).sum(), [qr, kr, vr])
        out[name + ": out"] = (yf.detach(), yr.detach())
        for nm, a, b in zip("qkv", grads, gr):
            out[f"{name}: d{nm}"] = (a.full_tensor() if hasattr(a, "full_tensor") else a, b)
    # 3-d inputs (no head dim), tokens sharded
    q3, k3, v3 = sh(Q[:, 0], sizes, 1), sh(K[:, 0], kv_sizes, 1), sh(V[:, 0], kv_sizes, 1)
    y3 = F.scaled_dot_product_attention(q3, k3, v3).full_tensor()
    out["3-d: out"] = (y3, F.scaled_dot_product_attention(Q[:, 0], K[:, 0], V[:, 0]))
    kp3 = KP[:, 0]  # (B, 1, m): one row per batch, sharded like the keys
    y3 = F.scaled_dot_product_attention(q3, k3, v3, attn_mask=cols(kp3, kv_sizes)).full_tensor()
    out["3-d key padding: out"] = (
        y3, F.scaled_dot_product_attention(Q[:, 0], K[:, 0], V[:, 0], attn_mask=kp3))
    try:
        F.scaled_dot_product_attention(sh(Q, sizes), sh(K, kv_sizes), sh(V, kv_sizes),
                                       dropout_p=0.1)
        out["dropout refused"] = ""
    except NotImplementedError as e:
        out["dropout refused"] = str(e)
    return out


def transformer_case(rank: int, world: int, sizes: tuple, compile_too: bool) -> dict:
    """The reference point transformer (self-attention blocks with a key-padding-free ring,
    and the cross-attention decoder) on tokens sharded unevenly: loss, every weight gradient
    and the input gradient against one process; optionally plain ``torch.compile`` too."""

    from meshshard.models import PointTransformer
    from meshshard.shardtensor._aten import from_local
    from meshshard.testing.inductor import private_inductor_cache

    private_inductor_cache()
    mesh = _mesh(world)
    n = sum(sizes)
    g = torch.Generator().manual_seed(n)
    X = torch.randn(1, n, 4, generator=g, dtype=torch.float64)
    Qp = torch.randn(1, n, 3, generator=g, dtype=torch.float64)
    Y = torch.randn(1, n, 2, generator=g, dtype=torch.float64)
    torch.manual_seed(0)
    model = PointTransformer(4, 2, dim=16, heads=2, depth=2, query_dim=3).to(torch.float64)
    xr = X.clone().requires_grad_()
    ref = ((model(xr, Qp) - Y) ** 2).mean()
    ref_g = torch.autograd.grad(ref, [xr, *model.parameters()])

    def run(fn):
        x = from_local(_rows(X, sizes, rank, 1).clone(), mesh, [Shard(1)], sizes) \
            .detach().requires_grad_()
        q, y = (from_local(_rows(t, sizes, rank, 1), mesh, [Shard(1)], sizes) for t in (Qp, Y))
        loss = ((fn(x, q) - y) ** 2).mean()
        gs = torch.autograd.grad(loss, [x, *model.parameters()])
        return loss.full_tensor().detach(), [gs[0].full_tensor(), *gs[1:]]

    out: dict = {}
    loss, gs = run(model)
    out["loss"] = (loss, ref.detach())
    for k, (a, b) in enumerate(zip(gs, ref_g)):
        out[f"grad {k}"] = (a, b)
    if compile_too:
        import torch._dynamo as dynamo

        dynamo.reset()
        counts = {"compiles": 0}

        def backend(gm, example_inputs):
            counts["compiles"] += 1
            return gm.forward

        explain = dynamo.explain(model)(
            from_local(_rows(X, sizes, rank, 1), mesh, [Shard(1)], sizes),
            from_local(_rows(Qp, sizes, rank, 1), mesh, [Shard(1)], sizes))
        out["graph breaks"] = explain.graph_break_count
        dynamo.reset()
        loss_c, gs_c = run(torch.compile(model, backend=backend))
        out["compiled loss"] = (loss_c, ref.detach())
        for k, (a, b) in enumerate(zip(gs_c, ref_g)):
            out[f"compiled grad {k}"] = (a, b)
        out["compiles"] = counts["compiles"]
    return out


def transformer_padding_case(rank: int, world: int, sizes: tuple) -> dict:
    """The point transformer with a key-padding mask sharded like the points (self-attention
    ring and cross-attention through ``nn.MultiheadAttention``), loss ``out.sum()`` (its
    gradient arrives replicated), eager and under plain ``torch.compile``: output, input and
    every weight gradient against one process; graph breaks and compiles counted."""

    import torch._dynamo as dynamo

    from meshshard.models import PointTransformer
    from meshshard.shardtensor._aten import from_local
    from meshshard.testing.inductor import private_inductor_cache

    private_inductor_cache()
    mesh = _mesh(world)
    n = sum(sizes)
    g = torch.Generator().manual_seed(n + 1)
    X = torch.randn(1, n, 4, generator=g, dtype=torch.float64)
    Qp = torch.randn(1, n, 3, generator=g, dtype=torch.float64)
    KPM = torch.rand(1, n, generator=g) < 0.3  # True = ignore this point as a key
    KPM[:, 0] = False
    torch.manual_seed(0)
    model = PointTransformer(4, 2, dim=16, heads=2, depth=1, query_dim=3).to(torch.float64)
    xr = X.clone().requires_grad_()
    ref = model(xr, Qp, KPM)
    ref_g = torch.autograd.grad(ref.sum(), [xr, *model.parameters()])

    def sh(t):
        return from_local(_rows(t, sizes, rank, 1).clone(), mesh, [Shard(1)], sizes)

    out: dict = {}
    counts = {"compiles": 0}

    def backend(gm, example_inputs):
        counts["compiles"] += 1
        return gm.forward

    dynamo.reset()
    out["graph breaks"] = dynamo.explain(model)(sh(X), sh(Qp), sh(KPM)).graph_break_count
    dynamo.reset()
    for tag, fn in (("eager", model), ("compiled", torch.compile(model, backend=backend))):
        x = sh(X).detach().requires_grad_()
        y = fn(x, sh(Qp), sh(KPM))
        gs = torch.autograd.grad(y.sum(), [x, *model.parameters()])
        out[f"{tag} out"] = (y.full_tensor().detach(), ref.detach())
        for k, (a, b) in enumerate(zip([gs[0].full_tensor(), *gs[1:]], ref_g)):
            out[f"{tag} grad {k}"] = (a, b)
    out["compiles"] = counts["compiles"]
    return out
