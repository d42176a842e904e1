"""Oracle cases for ShardTensor op families, run inside real gloo ranks.

Every case builds the same full inputs on every rank (fixed seeds), shards the ones marked
sharded along their sharded dim with the layout under test, runs ``f`` on ShardTensors and on
plain tensors, and compares the forward result (``full_tensor()``) and the gradients of every
input with the single-process reference: ``op(sharded).full_tensor() == op(full)``.
"""

from __future__ import annotations

import traceback

import torch
import torch.nn.functional as F

RTOL, ATOL = 1e-5, 1e-6


def _split(full, dim, sizes, rank):
    off = sum(sizes[:rank])
    return full.narrow(dim, off, sizes[rank])


# each case: (family, name, make_inputs(N) -> list[(tensor, sharded_dim or None)], f)
def _inputs_bn(N, *, extra=()):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, N, 6, generator=g)
    y = torch.randn(2, N, 6, generator=g)
    out = [(x, 1), (y, 1)]
    for shape in extra:
        out.append((torch.randn(*shape, generator=g), None))
    return out


CASES = []


def case(family, name, inputs, f):
    CASES.append((family, name, inputs, f))


# pointwise ---------------------------------------------------------------------------------
case("pointwise", "mul_add_sin", lambda N: _inputs_bn(N), lambda x, y: x * y + torch.sin(x))
case("pointwise", "broadcast_replicated_row", lambda N: _inputs_bn(N, extra=[(1, 1, 6)]),
     lambda x, y, w: (x - y) / (w.abs() + 1) + w)
case("pointwise", "replicated_full_size", lambda N: _inputs_bn(N, extra=[(2, N, 6)]),
     lambda x, y, z: x * z + y)
case("pointwise", "activations", lambda N: _inputs_bn(N),
     lambda x, y: F.gelu(x) + F.silu(y) + torch.sigmoid(x) * torch.tanh(y) + F.relu(x - y))
case("pointwise", "where_clamp_pow", lambda N: _inputs_bn(N),
     lambda x, y: torch.where(x > 0, x, y).clamp(-1, 1) + (y * y) ** 1.5)
case("pointwise", "scalar_ops", lambda N: _inputs_bn(N),
     lambda x, y: 2 - x * 3 + 1 / (y * y + 1) + x.exp() * 0.1)


def _inplace(x, y):
    z = x.clone()
    z.mul_(2)
    z.add_(y)
    z += 1
    return z


case("pointwise", "inplace", lambda N: _inputs_bn(N), _inplace)

# reductions --------------------------------------------------------------------------------
case("reductions", "sum_sharded_dim", lambda N: _inputs_bn(N), lambda x, y: (x * y).sum(dim=1))
case("reductions", "mean_keepdim_broadcast", lambda N: _inputs_bn(N),
     lambda x, y: x - x.mean(dim=1, keepdim=True) + y.mean())
case("reductions", "sum_other_dim", lambda N: _inputs_bn(N),
     lambda x, y: x.sum(-1)[..., None] * y.sum(0)[None])
case("reductions", "full_sum", lambda N: _inputs_bn(N), lambda x, y: (x * y).sum() + x.mean())
case("reductions", "amax_amin", lambda N: _inputs_bn(N),
     lambda x, y: x.amax(dim=1) + y.amin(dim=(0, 1)))
case("reductions", "max_values_indices", lambda N: _inputs_bn(N),
     lambda x, y: x.max(dim=1).values * 2 + x.max(dim=1).indices.float() + y.max())
case("reductions", "var_std", lambda N: _inputs_bn(N),
     lambda x, y: x.var(dim=1) + y.std(dim=1, keepdim=True).squeeze(1) + x.var())
case("reductions", "norm", lambda N: _inputs_bn(N),
     lambda x, y: x.norm(dim=1) + torch.linalg.vector_norm(y, 3, dim=(1, 2))[:, None])
case("reductions", "logsumexp", lambda N: _inputs_bn(N), lambda x, y: torch.logsumexp(x + y, dim=1))

# matmul / einsum / linear ------------------------------------------------------------------
case("linalg", "matmul_replicated_weight", lambda N: _inputs_bn(N, extra=[(6, 4)]),
     lambda x, y, w: (x + y) @ w)
case("linalg", "einsum_contract_sharded", lambda N: _inputs_bn(N),
     lambda x, y: torch.einsum("bnc,bnd->bcd", x, y))
case("linalg", "einsum_keep_sharded", lambda N: _inputs_bn(N, extra=[(2, 6, 5)]),
     lambda x, y, t: torch.einsum("bnc,bcd->bnd", x, t)
     + torch.einsum("bnc,bnc->bn", x, y)[..., None])
case("linalg", "matmul_contract_sharded", lambda N: _inputs_bn(N),
     lambda x, y: torch.matmul(x.transpose(1, 2), y))
case("linalg", "bmm_and_linear", lambda N: _inputs_bn(N, extra=[(4, 6), (4,)]),
     lambda x, y, w, b: F.linear(x, w, b) + torch.bmm(y, w.t().expand(2, 6, 4)))
case("linalg", "linear_contract_sharded", lambda N: _inputs_bn(N, extra=[(3, N), (3,)]),
     lambda x, y, w, b: F.linear((x + y).transpose(1, 2), w, b))

# nn ----------------------------------------------------------------------------------------
case("nn", "softmax_sharded_dim", lambda N: _inputs_bn(N),
     lambda x, y: torch.softmax(x, dim=1) * y + F.log_softmax(y, dim=1))
case("nn", "softmax_local_dim", lambda N: _inputs_bn(N),
     lambda x, y: F.softmax(x, dim=-1) + y.log_softmax(-1))
case("nn", "layer_norm", lambda N: _inputs_bn(N, extra=[(6,), (6,)]),
     lambda x, y, w, b: F.layer_norm(x + y, (6,), w, b))
case("nn", "layer_norm_over_sharded", lambda N: _inputs_bn(N, extra=[(N, 6), (N, 6)]),
     lambda x, y, w, b: F.layer_norm(x * y, tuple(x.shape[1:]), w, b))
case("nn", "group_norm", lambda N: _inputs_bn(N, extra=[(6,), (6,)]),
     lambda x, y, w, b: F.group_norm((x + y).transpose(1, 2), 3, w, b))
case("nn", "dropout_eval_gelu", lambda N: _inputs_bn(N),
     lambda x, y: F.dropout(F.gelu(x), p=0.5, training=False) + y)
case("nn", "sdpa_query_sharded", lambda N: _inputs_bn(N, extra=[(2, 5, 6), (2, 5, 6)]),
     lambda x, y, k, v: F.scaled_dot_product_attention(x, k, v) + y)
def _sdpa_tokens(x, y):
    tok = torch.einsum("bnc,bnd->bcd", x, y) / x.shape[1]  # Partial over the points
    q = tok.reshape(2, 1, 6, 6)
    att = F.scaled_dot_product_attention(q, q * 0.5, q.tanh())  # all replicated
    return torch.einsum("bhcd,bnd->bnc", att, y)


case("nn", "sdpa_replicated_tokens", lambda N: _inputs_bn(N), _sdpa_tokens)
case("nn", "normalize", lambda N: _inputs_bn(N),
     lambda x, y: F.normalize(x, dim=-1) + F.normalize(y, dim=1))

# views -------------------------------------------------------------------------------------
case("views", "reshape_split_merge", lambda N: _inputs_bn(N),
     lambda x, y: (x.reshape(2, -1, 2, 3) * y.view(2, x.shape[1], 2, 3)).reshape(2, x.shape[1], 6))
case("views", "permute_transpose", lambda N: _inputs_bn(N),
     lambda x, y: x.permute(2, 0, 1).transpose(0, 1) + y.permute(0, 2, 1))
case("views", "squeeze_unsqueeze_flatten", lambda N: _inputs_bn(N),
     lambda x, y: (x.unsqueeze(2).unsqueeze(0).squeeze(0) * 2).flatten(2) + y)
case("views", "expand_movedim", lambda N: _inputs_bn(N),
     lambda x, y: x[:, :, None, :].expand(2, x.shape[1], 3, 6).sum(2)
     + y.movedim(1, 0).movedim(0, 1))
case("views", "flatten_sharded_into_inner", lambda N: [(torch.randn(N, 2, 3), 0)],
     lambda x: x.flatten(0, 1) * 2)
case("views", "chunk_unbind", lambda N: _inputs_bn(N),
     lambda x, y: x.chunk(3, dim=-1)[1] + torch.unbind(y, dim=0)[1][None, :, :2])

# cat / stack -------------------------------------------------------------------------------
case("cat", "cat_channels", lambda N: _inputs_bn(N, extra=[(1, 1, 2)]),
     lambda x, y, w: torch.cat([x, y, w.expand(2, x.shape[1], 2)], dim=-1))
case("cat", "cat_sharded_dim", lambda N: _inputs_bn(N), lambda x, y: torch.cat([x, y * 2], dim=1))
case("cat", "stack", lambda N: _inputs_bn(N), lambda x, y: torch.stack([x, y], dim=0).sum(0))

# indexing ----------------------------------------------------------------------------------
case("indexing", "slice_sharded", lambda N: _inputs_bn(N),
     lambda x, y: x[:, 1 : x.shape[1] - 1] * y[:, 2:])
case("indexing", "step_and_int", lambda N: _inputs_bn(N),
     lambda x, y: x[:, ::2, 1] + y[:, 3][:, None, :1])
case("indexing", "index_select_sorted_and_not", lambda N: _inputs_bn(N),
     lambda x, y: x.index_select(1, torch.tensor([0, 2, 2, x.shape[1] - 1]))
     + y.index_select(1, torch.tensor([x.shape[1] - 1, 0, 3, 1])))
case("indexing", "narrow_ellipsis", lambda N: _inputs_bn(N),
     lambda x, y: x.narrow(1, 1, x.shape[1] - 2)[..., :3] + y[..., 1 : x.shape[1] - 1, 3:])

# conversions -------------------------------------------------------------------------------
case("conversions", "to_clone_detach", lambda N: _inputs_bn(N),
     lambda x, y: x.double().float() + y.clone() + x.detach() * 0 + y.contiguous())


# rules the cases above do not reach ---------------------------------------------------------
def _inputs_idx(N):
    g = torch.Generator().manual_seed(2)
    return [*_inputs_bn(N), (torch.randint(0, 6, (2, N, 6), generator=g), 1)]


case("views", "squeeze_variants", lambda N: _inputs_bn(N),
     lambda x, y: x.unsqueeze(0).squeeze() + y.unsqueeze(0).unsqueeze(3).squeeze((0, 3))
     + torch.ops.aten.squeeze.dims(x.unsqueeze(0), [0]))
case("conversions", "like_fill_alias", lambda N: _inputs_bn(N),
     lambda x, y: torch.ops.aten.alias.default(x) + torch.full_like(x, 2.0) * y
     + torch.empty_like(x).fill_(1.5) * x + torch.zeros_like(y).zero_()
     + y * float(torch.ops.aten.is_same_size.default(x, y)))
case("linalg", "addmm_split_with_sizes", lambda N: _inputs_bn(N, extra=[(4,), (6, 4)]),
     lambda x, y, b, w: torch.addmm(b, x[0], w).sum(1, keepdim=True)
     * torch.cat(torch.split(y[1], [2, 4], dim=1)[::-1], dim=1))
case("indexing", "new_factories", lambda N: _inputs_bn(N),
     lambda x, y: x.new_ones(x.shape) * y + x.new_full(x.shape, 2.0) * x
     + x.new_zeros(x.shape) + x.new_empty(x.shape).fill_(0.5) * y)
case("indexing", "scatter_in_place_and_reduce", lambda N: _inputs_idx(N),
     lambda x, y, i: _scatters(x, y, i))
case("reductions", "any_dims", lambda N: _inputs_bn(N),
     lambda x, y: x * (y > 0).any(dim=(0, 2), keepdim=True) + y * (x > 2).any())
case("pointwise", "leaky_relu", lambda N: _inputs_bn(N),
     lambda x, y: torch.nn.functional.leaky_relu(x - y, 0.1))
case("reductions", "nansum", lambda N: _inputs_bn(N),
     lambda x, y: torch.nansum(torch.where(y > 1, torch.nan, x), dim=1)
     + torch.nansum(x * y, dim=(0, 2), keepdim=True).sum(1) + torch.nansum(y))
case("reductions", "topk_along_sharded_dim", lambda N: _inputs_bn(N),
     lambda x, y: torch.topk(x, 3, dim=1)[0] * torch.topk(y, 3, dim=1, largest=False)[0]
     + torch.topk(x, 3, dim=1)[1].to(x.dtype))


def _scatters(x, y, i):
    z = x.clone()
    z.scatter_(2, i, y)
    z.scatter_add_(2, i, y * 2)
    z.index_add_(2, torch.tensor([0, 2]), y[..., :2])
    z.masked_fill_(y > 1.0, torch.tensor(0.25))
    z.scatter_(2, i, 0.5)
    z.scatter_reduce_(2, i, y, "amax")  # last: its backward reads its result
    d = x.detach()  # (torch has no derivative of scatter with reduce=)
    return z + torch.scatter(d, 2, i, y.detach(), reduce="add") \
        + d.scatter(2, i, 1.5, reduce="multiply")


# ------------------------------------------------------------------------------------------
def run_cases(rank, world_size, sizes, families=None):
    """Rank function: run every case, return {case: None | error text}."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, ShardTensor, from_local

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world_size,))
    N = sum(sizes)
    results = {}
    for family, name, make, f in CASES:
        if families and family not in families:
            continue
        key = f"{family}/{name}"
        try:
            inputs = make(N)
            ref_in = [t.clone().requires_grad_(t.dtype.is_floating_point) for t, _ in inputs]
            ref = f(*ref_in)
            R = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7))
            (ref * R).sum().backward()
            dist_in, leaves = [], []
            for (t, d), r in zip(inputs, ref_in):
                if d is None:
                    leaf = t.clone().requires_grad_(t.dtype.is_floating_point)
                    dist_in.append(leaf)
                else:
                    leaf = _split(t, d, sizes, rank).clone()
                    leaf.requires_grad_(t.dtype.is_floating_point)
                    dist_in.append(from_local(leaf, mesh, [Shard(d)], sizes))
                leaves.append((leaf, d, r))
            out = f(*dist_in)
            full = out.full_tensor() if isinstance(out, ShardTensor) else out
            torch.testing.assert_close(full, ref.detach(), rtol=RTOL, atol=ATOL)
            (full * R).sum().backward()
            for k, (leaf, d, r) in enumerate(leaves):
                if not leaf.dtype.is_floating_point:  # (index tensors)
                    continue
                want = r.grad if d is None else _split(r.grad, d, sizes, rank)
                got = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL,
                                           msg=lambda m, k=k: f"grad of input {k}: {m}")
            results[key] = None
        except Exception:
            results[key] = traceback.format_exc()
    return results
