"""Rank functions for ``test_tp.py``: tensor-parallel linears and products over tensors
sharded on several dims (``rules/tp.py``) on a 3-D ("data", "domain", "tensor") mesh,
against one process on the full data, fp64.

Every case builds its operands from full tensors (same seed on every rank) as ShardTensor
leaves in the layout it names (``S<d>`` Shard on tensor dim d, ``P`` Partial, ``R``), runs one
expression, and returns per output and per leaf gradient (``torch.autograd.grad`` of a random
projection) the pair (sharded result as a full tensor, one-process result). Also the einsum
over heads of a tensor sharded on "data" and "domain", a case of
:mod:`tests.shardtensor._rule_cases`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tests.shardtensor._rule_cases import R, case

B, H, K, D, S, O = 3, 2, 4, 3, 5, 6


class _Count(TorchDispatchMode):
    """Functional all-reduces per mesh dim name, seen below the wrapper."""

    def __init__(self, mesh):
        super().__init__()
        self.names = {mesh.get_group(i).group_name: n for i, n in enumerate(mesh.mesh_dim_names)}
        self.seen: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from meshshard.shardtensor import ShardTensor

        if any(issubclass(t, ShardTensor) for t in types):
            return NotImplemented
        if func is torch.ops._c10d_functional.all_reduce.default:
            name = self.names.get(args[2], "other")
            self.seen[name] = self.seen.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _piece(full, mesh, layout, sizes):
    """This rank's piece of ``full`` in ``layout`` (one entry per mesh dim). A Partial dim
    holds full / n plus a term that sums to zero over the mesh dim."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    coord = mesh.get_coordinate()
    placements, per_dim = [], []
    g = torch.Generator().manual_seed(7)
    delta = torch.randn(full.shape, generator=g, dtype=full.dtype)
    t = full
    for i, code in enumerate(layout):
        n = mesh.size(i)
        if code == "R":
            placements.append(Replicate())
            per_dim.append(None)
        elif code == "P":
            placements.append(Partial())
            per_dim.append(None)
            t = t / n + (coord[i] - (n - 1) / 2) * delta
        else:
            d = int(code[1:])
            s = sizes[d]
            placements.append(Shard(d))
            per_dim.append(s)
            off = sum(s[: coord[i]])
            t = t.narrow(d, off, s[coord[i]])
            delta = delta.narrow(d, off, s[coord[i]])
    return t.contiguous(), placements, per_dim


def _leaf(full, mesh, layout, sizes):
    from meshshard.shardtensor._aten import wrap_local

    local, placements, per_dim = _piece(full, mesh, layout, sizes)
    return wrap_local(local, mesh, placements, per_dim).detach().requires_grad_(True)


def _cases(mesh, n_sizes):
    """name -> (operands: list of (full shape, layout or None for a plain leaf), fn,
    expected output placements or None)."""
    t = mesh.size(2)
    b = (B,) if mesh.size(0) == 1 else (1, 2)
    n = n_sizes
    h = (H // t,) * t
    k = (K // 2,) * 2 if t == 2 else (K,)
    o = (O // t,) * t
    # per case: the per-rank sizes of each tensor dim, for the mesh dims that shard it
    cases = {
        "colwise": ([((B, sum(n), K), ("S0", "S1", "R"), {0: b, 1: n}),
                     ((O, K), ("R", "R", "S0"), {0: o}),
                     ((O,), ("R", "R", "S0"), {0: o})],
                    lambda x, w, bb: F.linear(x, w, bb), ("S(0)", "S(1)", "S(2)")),
        "rowwise": ([((B, sum(n), K), ("S0", "S1", "S2"), {0: b, 1: n, 2: k}),
                     ((O, K), ("R", "R", "S1"), {1: k}), ((O,), None, {})],
                    lambda x, w, bb: F.linear(x, w, bb), ("S(0)", "S(1)", "R")),
        "rowwise_no_bias": ([((B, sum(n), K), ("S0", "S1", "S2"), {0: b, 1: n, 2: k}),
                             ((O, K), ("R", "R", "S1"), {1: k})],
                            lambda x, w: F.linear(x, w), ("S(0)", "S(1)", "P(sum)")),
        "colwise_plain_input": ([((2, K), None, {}), ((O, K), ("R", "R", "S0"), {0: o})],
                                lambda x, w: F.linear(x, w), ("R", "R", "S(1)")),
        "einsum_points_heads_batch": (
            [((B, H, sum(n), D), ("S0", "S2", "S1"), {0: b, 1: h, 2: n}),
             ((B, H, sum(n), S), ("S0", "S2", "S1"), {0: b, 1: h, 2: n})],
            lambda a, c: torch.einsum("bhnd,bhns->bhsd", a, c), ("S(0)", "P(sum)", "S(1)")),
        "matmul_partial": (
            [((B, H, S, D), ("S0", "P", "S1"), {0: b, 1: h}),
             ((B, H, D, S), ("R", "R", "S1"), {1: h})],
            lambda a, c: torch.matmul(a, c), ("S(0)", "P(sum)", "S(1)")),
        "linear_plain_weight_partial_input": (
            [((B, H, S, D), ("S0", "P", "S1"), {0: b, 1: h}), ((O, D), None, {}),
             ((O,), None, {})],
            lambda x, w, bb: F.linear(x, w, bb), ("S(0)", "R", "S(1)")),
        "split_heads_view": (
            [((B, sum(n), H * D), ("S0", "S1", "S2"), {0: b, 1: n, 2: tuple(v * D for v in h)})],
            lambda x: (x.reshape(B, sum(n), H, D) * 2).permute(0, 2, 1, 3),
            ("S(0)", "S(2)", "S(1)")),
    }
    return cases


def all_cases(rank, world_size, shapes, layouts):
    """For each mesh shape and point layout: every case's (result, reference) pairs, the
    output placements, the forward all-reduces per mesh dim, and one second-order term."""
    from torch.distributed.device_mesh import init_device_mesh

    out = {}
    for shape in shapes:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("data", "domain", "tensor"))
        for n in layouts[shape[1]]:
            out[(shape, n)] = _run(mesh, n)
    return out


def _run(mesh, n):
    pairs, placements, counts = {}, {}, {}
    g = torch.Generator().manual_seed(3)
    for name, (operands, fn, want) in _cases(mesh, n).items():
        fulls = [torch.randn(s, generator=g, dtype=torch.float64) for s, _, _ in operands]
        leaves = []
        for full, (_, layout, sizes) in zip(fulls, operands):
            if layout is None:
                leaves.append(full.clone().requires_grad_(True))
            else:
                leaves.append(_leaf(full, mesh, layout, sizes))
        refs = [f.clone().requires_grad_(True) for f in fulls]
        with _Count(mesh) as counter:
            y = fn(*leaves)
        counts[name] = counter.seen
        placements[name] = (tuple(str(p) for p in y.placements), want)
        y_ref = fn(*refs)
        proj = torch.randn(y_ref.shape, generator=g, dtype=torch.float64)
        pairs[f"{name} out"] = (y.full_tensor().detach(), y_ref.detach())
        grads = torch.autograd.grad((y * proj).sum(), leaves)
        grads_ref = torch.autograd.grad((y_ref * proj).sum(), refs)
        for k, (gr, gref) in enumerate(zip(grads, grads_ref)):
            got = gr.full_tensor() if hasattr(gr, "full_tensor") else gr
            pairs[f"{name} grad {k}"] = (got.detach(), gref)
    # second order: d/dx of <d/dW sum(linear(x, W)^2), V> (column-parallel W)
    operands, fn, _ = _cases(mesh, n)["colwise"]
    fulls = [torch.randn(s, generator=g, dtype=torch.float64) for s, _, _ in operands]
    v = torch.randn(fulls[1].shape, generator=g, dtype=torch.float64)
    x, w, bb = (_leaf(f, mesh, lay, s) for f, (_, lay, s) in zip(fulls, operands))
    xr, wr, br = (f.clone().requires_grad_(True) for f in fulls)
    (gw,) = torch.autograd.grad((fn(x, w, bb) ** 2).sum(), w, create_graph=True)
    (gwr,) = torch.autograd.grad((fn(xr, wr, br) ** 2).sum(), wr, create_graph=True)
    (d2,) = torch.autograd.grad((gw * v).sum(), x)
    (d2r,) = torch.autograd.grad((gwr * v).sum(), xr)
    pairs["second order d2"] = (d2.full_tensor(), d2r)
    return {"pairs": pairs, "placements": placements, "counts": counts}


@case("tp", "einsum_heads_data_x_domain", seed=2010, plain_grads=True,
      extras=[(R, (2, 3, 4, 5), True)])
def _c(x, tok):
    n = x.shape[1]
    w = torch.softmax(x[..., :4], -1).unsqueeze(1).expand(2, 3, n, 4) * 1.5  # B H N S
    return torch.einsum("bhsd,bhns->bhnd", tok, w), torch.einsum("bhnd,bhns->bhsd",
                                                                 x.unsqueeze(1) * tok[..., :1, :],
                                                                 w)
