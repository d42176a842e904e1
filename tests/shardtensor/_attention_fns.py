"""Rank functions for ``test_attention.py`` (run inside real gloo ranks).

Each ring-attention case builds the same full inputs on every rank (fixed seeds), shards them as
the case says, runs ``F.scaled_dot_product_attention`` on ShardTensors and on the full tensors,
and compares the output and the gradients of q, k and v with the single-process result.
:func:`sdpa_cases` returns such pairs in fp64 for the test to compare (masks sharded like the
query rows or on their key dim), and the reference point transformer eager and compiled.
"""

from __future__ import annotations

import traceback

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Shard

TOL = {torch.float64: (1e-10, 1e-12), torch.float32: (1e-5, 2e-6)}


def _split(full, dim, sizes, rank):
    return full.narrow(dim, sum(sizes[:rank]), sizes[rank])


def _shard(full, dim, sizes, rank, mesh):
    """A leaf (the local piece, or the full tensor when ``sizes`` is None) and its ShardTensor."""
    from meshshard.shardtensor import Replicate, Shard, from_local

    if sizes is None:
        leaf = full.clone().requires_grad_(full.dtype.is_floating_point)
        return leaf, from_local(leaf, mesh, [Replicate()])
    leaf = _split(full, dim, sizes, rank).clone().requires_grad_(full.dtype.is_floating_point)
    return leaf, from_local(leaf, mesh, [Shard(dim)], sizes)


def _inputs(c):
    g = torch.Generator().manual_seed(c.get("seed", 3))
    dt = c.get("dtype", torch.float64)
    B, H, E = c.get("B", 2), c.get("H", 2), c.get("E", 8)
    Hk = c.get("Hk", H)
    Lq, Lk = sum(c["q"]) if c["q"] else c["Lq"], sum(c["kv"]) if c["kv"] else c["Lk"]
    Ev = c.get("Ev", E)
    q = torch.randn(B, H, Lq, E, generator=g, dtype=dt)
    k = torch.randn(B, Hk, Lk, E, generator=g, dtype=dt)
    v = torch.randn(B, Hk, Lk, Ev, generator=g, dtype=dt)
    mask = None
    kind = c.get("mask")
    if kind in ("bool_rows", "bool_rep"):
        mask = torch.rand(B, 1, Lq, Lk, generator=g) > 0.3
        mask[..., 0] = True  # every query sees one key (torch and we agree anyway; see dead)
    elif kind == "bool_heads":  # a mask per head
        mask = torch.rand(B, H, Lq, Lk, generator=g) > 0.3
        mask[..., 0] = True
    elif kind == "dead_rows":
        mask = torch.rand(B, 1, Lq, Lk, generator=g) > 0.5
        mask[:, :, 1] = False  # a query that sees no key at all: output and grads are 0
    elif kind == "add_rep":
        mask = torch.randn(Lq, Lk, generator=g, dtype=dt)
    elif kind in ("kpm", "kpm_rep"):
        mask = torch.rand(B, 1, 1, Lk, generator=g) > 0.25
        mask[..., 0] = True
    return q, k, v, mask


def _mask_st(mask, c, rank, mesh):
    from meshshard.shardtensor import Replicate, Shard, from_local

    kind = c.get("mask")
    if mask is None:
        return None
    if kind in ("bool_rows", "dead_rows", "bool_heads"):
        return from_local(_split(mask, 2, c["q"], rank).clone(), mesh, [Shard(2)], c["q"])
    if kind == "kpm":
        return from_local(_split(mask, 3, c["kv"], rank).clone(), mesh, [Shard(3)], c["kv"])
    if kind == "bool_rep":
        return from_local(mask, mesh, [Replicate()])
    return mask  # plain tensor: replicated


def _run_case(c, rank, mesh):
    from meshshard.shardtensor._aten import attention_ring as ring_attention

    default, default_q = ring_attention.KV_CHUNK_ROWS, ring_attention.Q_TILE_ROWS
    ring_attention.KV_CHUNK_ROWS = c.get("chunk", default)  # several passes per head
    ring_attention.Q_TILE_ROWS = c.get("qtile", default_q)  # several query tiles per block
    try:
        _check_case(c, rank, mesh)
    finally:
        ring_attention.KV_CHUNK_ROWS, ring_attention.Q_TILE_ROWS = default, default_q


def _check_case(c, rank, mesh):

    q, k, v, mask = _inputs(c)
    kw = {"is_causal": c.get("causal", False), "scale": c.get("scale")}
    if c.get("Hk", c.get("H", 2)) != c.get("H", 2):
        kw["enable_gqa"] = True
    refs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*refs, attn_mask=mask, **kw)
    R = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7), dtype=ref.dtype)
    (ref * R).sum().backward()
    layout = c.get("layout", "bhne")
    leaves, ins = [], []
    for t, sizes in ((q, c["q"]), (k, c["kv"]), (v, c["kv"])):
        if layout == "bnhe":  # shard (B, N, H, E) on N and permute to (B, H, N, E)
            leaf, st = _shard(t.transpose(1, 2).contiguous(), 1, sizes, rank, mesh)
            st = st.permute(0, 2, 1, 3)
        elif layout == "3d":  # (B*H, N, E)
            leaf, st = _shard(t.flatten(0, 1), 1, sizes, rank, mesh)
        else:
            leaf, st = _shard(t, 2, sizes, rank, mesh)
        leaves.append(leaf)
        ins.append(st)
    m = _mask_st(mask, c, rank, mesh)
    if layout == "3d" and m is not None:  # (B, 1, Lq|1, Lk) -> (B*H, Lq|1, Lk)
        m = m.expand(q.shape[0], q.shape[1], *m.shape[2:]).flatten(0, 1)
    out = F.scaled_dot_product_attention(*ins, attn_mask=m, **kw)
    full = out.full_tensor()
    if layout == "3d":
        full = full.view(ref.shape)
    rtol, atol = TOL[q.dtype]
    torch.testing.assert_close(full, ref.detach(), rtol=rtol, atol=atol)
    Rl = R.flatten(0, 1) if layout == "3d" else R
    (out.full_tensor() * Rl).sum().backward()
    for name, leaf, r, sizes in zip("qkv", leaves, refs, (c["q"], c["kv"], c["kv"])):
        want = r.grad
        if layout == "bnhe":
            want = want.transpose(1, 2)
            dim = 1
        elif layout == "3d":
            want = want.flatten(0, 1)
            dim = 1
        else:
            dim = 2
        if sizes is not None:
            want = _split(want, dim, sizes, rank)
        got = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol,
                                   msg=lambda msg, n=name: f"grad of {n}: {msg}")


def attention_cases(rank, world_size, cases, bad_cases):
    """Rank function: {case index: None | traceback}, {bad index: (type name, message)}, the
    all-reduced check value, and the p2p census of the good cases ((grouped, ungrouped,
    batches): every ring shift must go through ``batch_isend_irecv``)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.testing.p2p_census import P2PCensus

    mesh = init_device_mesh("cpu", (world_size,))
    results = {}
    with P2PCensus() as census:
        for i, c in enumerate(cases):
            try:
                _run_case(c, rank, mesh)
                results[i] = None
            except Exception:
                results[i] = traceback.format_exc()
    bad = {}
    for i, name in enumerate(bad_cases):
        try:
            _BAD[name](rank, world_size, mesh)
            bad[i] = ("no error", "")
        except Exception as exc:
            bad[i] = (type(exc).__name__, str(exc))
    # the group still works after every refusal (no rank is stuck in a collective)
    t = torch.ones(1)
    torch.distributed.all_reduce(t)
    return results, bad, float(t), (census.grouped, census.ungrouped, census.batches)


# ------------------------------------------------------------------------------ bad input
def _qkv(rank, world_size, mesh, *, kv_sizes=None, v_sizes=None, Ek=8, mask=None):
    from meshshard.shardtensor import Shard, from_local

    P = world_size
    qs = [2] * P
    ks = kv_sizes or [1] * (P - 1) + [3]
    vs = v_sizes or ks
    g = torch.Generator().manual_seed(0)
    q = from_local(torch.randn(1, 2, qs[rank], 8, generator=g), mesh, [Shard(2)], qs)
    k = from_local(torch.randn(1, 2, ks[rank], Ek, generator=g), mesh, [Shard(2)], ks)
    v = from_local(torch.randn(1, 2, vs[rank], 8, generator=g), mesh, [Shard(2)], vs)
    return q, k, v


def _bad_kv_layouts(rank, world_size, mesh):
    P = world_size
    q, k, v = _qkv(rank, world_size, mesh, kv_sizes=[1] * (P - 1) + [3],
                   v_sizes=[3] + [1] * (P - 1))
    return F.scaled_dot_product_attention(q, k, v)


def _bad_v_replicated(rank, world_size, mesh):
    q, k, v = _qkv(rank, world_size, mesh)
    return F.scaled_dot_product_attention(q, k, v.redistribute([_rep()]))


def _rep():
    from meshshard.shardtensor import Replicate

    return Replicate()


def _bad_head_dims(rank, world_size, mesh):
    q, k, v = _qkv(rank, world_size, mesh, Ek=4)
    return F.scaled_dot_product_attention(q, k, v)


def _bad_mask_shape(rank, world_size, mesh):
    q, k, v = _qkv(rank, world_size, mesh)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.bool))


def _bad_mask_layout(rank, world_size, mesh):
    from meshshard.shardtensor import Shard, from_local

    q, k, v = _qkv(rank, world_size, mesh)
    P = world_size
    rows = [2 * P] + [0] * (P - 1)  # right shape, rows split differently from the query's
    m = torch.ones(1, 1, rows[rank], k.shape[2], dtype=torch.bool)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=from_local(m, mesh, [Shard(2)], rows))


def _bad_mask_partial(rank, world_size, mesh):
    from meshshard.shardtensor import Partial, from_local

    q, k, v = _qkv(rank, world_size, mesh)
    m = torch.zeros(1, 1, q.shape[2], k.shape[2], dtype=q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=from_local(m, mesh, [Partial()]))


def _bad_mask_grad(rank, world_size, mesh):
    from meshshard.shardtensor import Shard, from_local

    q, k, v = _qkv(rank, world_size, mesh)
    m = torch.zeros(1, 1, 1, k.to_local().shape[2], dtype=q.dtype, requires_grad=True)
    kpm = from_local(m, mesh, [Shard(3)], k.sharding_sizes())
    return F.scaled_dot_product_attention(q, k, v, attn_mask=kpm)


def _bad_dropout(rank, world_size, mesh):
    q, k, v = _qkv(rank, world_size, mesh)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)


def _bad_mha_weights(rank, world_size, mesh):
    q, _, _ = _qkv(rank, world_size, mesh)
    x = q[:, 0]  # (1, L, 8), tokens sharded
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    return mha(x, x, x)  # need_weights=True by default


_BAD = {
    "kv_layouts": _bad_kv_layouts,
    "v_replicated": _bad_v_replicated,
    "head_dims": _bad_head_dims,
    "mask_shape": _bad_mask_shape,
    "mask_layout": _bad_mask_layout,
    "mask_partial": _bad_mask_partial,
    "mask_grad": _bad_mask_grad,
    "dropout": _bad_dropout,
    "mha_need_weights": _bad_mha_weights,
}


def attention_2d(rank, world_size, q_sizes, kv_sizes):
    """2-D mesh (data x domain): batch sharded on "data", tokens (uneven) on "domain"; causal
    ring attention, then a key-padding mask laid out like the keys, vs one process. Returns None
    or the traceback."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    try:
        mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("data", "domain"))
        dc, pc = mesh.get_coordinate()
        g = torch.Generator().manual_seed(5)
        dt = torch.float64
        q = torch.randn(2, 2, sum(q_sizes), 8, generator=g, dtype=dt)
        k = torch.randn(2, 2, sum(kv_sizes), 8, generator=g, dtype=dt)
        v = torch.randn(2, 2, sum(kv_sizes), 8, generator=g, dtype=dt)
        refs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*refs, is_causal=True)
        R = torch.randn(ref.shape, generator=g, dtype=dt)
        (ref * R).sum().backward()
        leaves, ins = [], []
        for t, sizes in ((q, q_sizes), (k, kv_sizes), (v, kv_sizes)):
            leaf = _split(t[dc : dc + 1], 2, sizes, pc).clone().requires_grad_(True)
            leaves.append(leaf)
            ins.append(from_local(leaf, mesh, [Shard(0), Shard(2)], {0: (1, 1), 1: sizes}))
        out = F.scaled_dot_product_attention(*ins, is_causal=True)
        full = out.full_tensor()
        torch.testing.assert_close(full, ref.detach(), rtol=1e-10, atol=1e-12)
        (full * R).sum().backward()
        for leaf, r, sizes in zip(leaves, refs, (q_sizes, kv_sizes, kv_sizes)):
            want = _split(r.grad[dc : dc + 1], 2, sizes, pc)
            torch.testing.assert_close(leaf.grad, want, rtol=1e-10, atol=1e-12)
        # a key-padding mask sharded on batch ("data") and on its keys ("domain") like the keys
        kpm = torch.rand(2, 1, 1, sum(kv_sizes), generator=g) > 0.3
        kpm[..., 0] = True
        refs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*refs, attn_mask=kpm)
        (ref * R).sum().backward()
        m = from_local(_split(kpm[dc : dc + 1], 3, kv_sizes, pc).clone(), mesh,
                       [Shard(0), Shard(3)], {0: (1, 1), 1: kv_sizes})
        for leaf in leaves:
            leaf.grad = None
        out = F.scaled_dot_product_attention(*ins, attn_mask=m)
        full = out.full_tensor()
        torch.testing.assert_close(full, ref.detach(), rtol=1e-10, atol=1e-12)
        (full * R).sum().backward()
        for leaf, r, sizes in zip(leaves, refs, (q_sizes, kv_sizes, kv_sizes)):
            want = _split(r.grad[dc : dc + 1], 2, sizes, pc)
            torch.testing.assert_close(leaf.grad, want, rtol=1e-10, atol=1e-12)
        return None
    except Exception:
        return traceback.format_exc()


def mha_replicated(rank, world_size):
    """``nn.MultiheadAttention`` on replicated ShardTensors, ``need_weights=True`` (torch runs it
    on the local tensors): output, attention weights, input and weight gradients vs one
    process. Returns None or the traceback."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Replicate, ShardTensor, from_local

    try:
        mesh = init_device_mesh("cpu", (world_size,))
        g = torch.Generator().manual_seed(9)
        X = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
        torch.manual_seed(0)
        mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
        xr = X.clone().requires_grad_()
        ref, ref_w = mha(xr, xr, xr)
        ref_g = torch.autograd.grad((ref ** 2).sum(), [xr, mha.in_proj_weight])
        leaf = X.clone().requires_grad_()
        x = from_local(leaf, mesh, [Replicate()])
        out, w = mha(x, x, x)
        assert isinstance(out, ShardTensor) and isinstance(w, ShardTensor)
        gs = torch.autograd.grad((out.full_tensor() ** 2).sum(), [leaf, mha.in_proj_weight])
        for got, want in ((out.full_tensor(), ref), (w.full_tensor(), ref_w), *zip(gs, ref_g)):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        return None
    except Exception:
        return traceback.format_exc()


def _mesh(world):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


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
        return from_local(_split(t, dim, s, rank).clone(), mesh, [Shard(dim)], s) \
            .detach().requires_grad_()

    def rep(t):
        return t.clone().requires_grad_()  # a plain tensor: lifted as Replicate

    # masks sharded on their key dim (the keys' sizes, or other sizes), bool and additive
    KP = torch.rand(2, 1, 1, m, generator=g) > 0.3  # a key-padding mask, True = attend
    KP[..., 0] = True
    A = torch.randn(n, m, generator=g, dtype=torch.float64).masked_fill(~M, float("-inf"))
    other = tuple(reversed(kv_sizes))  # sums to m, split differently from the keys

    def cols(t, s):
        return from_local(_split(t, t.ndim - 1, s, rank).clone(), mesh, [Shard(t.ndim - 1)], s)

    ring = (lambda: sh(Q, sizes), lambda: sh(K, kv_sizes), lambda: sh(V, kv_sizes))
    merge = (lambda: rep(Q), lambda: sh(K, kv_sizes), lambda: sh(V, kv_sizes))
    local = (lambda: sh(Q, sizes), lambda: rep(K), lambda: rep(V))
    cases = {
        "ring": (*ring, {}, None),
        "ring causal": (*ring, {"is_causal": True}, None),
        "ring bool mask": (*ring, {"attn_mask": M}, M),
        "ring mask sharded like the rows": (
            *ring, {"attn_mask": from_local(_split(M, 0, sizes, rank), mesh, [Shard(0)], sizes)},
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
        x = from_local(_split(X, 1, sizes, rank).clone(), mesh, [Shard(1)], sizes) \
            .detach().requires_grad_()
        q, y = (from_local(_split(t, 1, sizes, rank), mesh, [Shard(1)], sizes) for t in (Qp, Y))
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
            from_local(_split(X, 1, sizes, rank), mesh, [Shard(1)], sizes),
            from_local(_split(Qp, 1, sizes, rank), mesh, [Shard(1)], sizes))
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
        return from_local(_split(t, 1, sizes, rank).clone(), mesh, [Shard(1)], sizes)

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
