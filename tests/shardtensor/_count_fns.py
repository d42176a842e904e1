"""Rank functions: how many all-reduces the rules run (counted with torch's profiler, so the
count is gloo's, not ours), and what they compute, against the same arithmetic on full tensors."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def _all_reduces(fn) -> tuple:
    """(result of ``fn()``, all-reduces it ran on this rank, in forward and in backward)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    n = sum(e.count for e in prof.key_averages() if e.key == "c10d::allreduce_")
    return out, n


def partial_memo(rank, world_size):
    """A Partial read by two products is reduced once; after an in-place change, again."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Partial, Replicate, from_local

    mesh = init_device_mesh("cpu", (world_size,))
    g = torch.Generator().manual_seed(0)
    pieces = torch.randn(world_size, 4, 3, generator=g, dtype=torch.float64)
    r1, r2 = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    p = from_local(pieces[rank].clone(), mesh, [Partial()])
    s1, s2 = (from_local(r, mesh, [Replicate()]) for r in (r1, r2))
    full = pieces.sum(0)

    def two_products():
        return (p * s1).full_tensor(), (p / s2).full_tensor()

    (a, b), n_two = _all_reduces(two_products)
    q = from_local(pieces[(rank + 1) % world_size].clone(), mesh, [Partial()])
    p.add_(q)  # in place, still Partial: the memo must not serve the old sum
    c, n_after = _all_reduces(lambda: (p * s1).full_tensor())
    with torch.no_grad():
        p.to_local().mul_(3.0)  # in place through the piece's view: not served either
    d, n_view = _all_reduces(lambda: (p * s1).full_tensor())
    # a Partial plus a number stays Partial (the number counted once), and two Partial
    # operands of one op are summed in one collective
    u = from_local(pieces[rank] * 2, mesh, [Partial()])
    v = from_local(pieces[rank] + 1, mesh, [Partial()])
    w = u + 0.5
    (e, f), n_pair = _all_reduces(lambda: ((w / (v - 3)).full_tensor(),
                                           (w * s1).full_tensor()))
    vfull = full + world_size
    return {"n_two": n_two, "n_after": n_after, "n_view": n_view, "n_pair": n_pair,
            "pair": [(e, (2 * full + 0.5) / (vfull - 3)), (f, (2 * full + 0.5) * r1)],
            "values": [(a, full * r1), (b, full / r2), (c, 2 * full * r1),
                       (d, 6 * full * r1)]}


def transolver_step(rank, world_size, sizes, layers, compiled=False, bucket=False):
    """All-reduces of one forward and one backward of the Transolver (fp64), and the loss and
    gradients against one process; ``compiled``: through plain ``torch.compile(model)``
    (aot_eager), counting the second (compiled) step."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.models import Transolver
    from meshshard.shardtensor import Shard, bucket_weight_grads, from_local

    mesh = init_device_mesh("cpu", (world_size,))
    torch.set_default_dtype(torch.float64)
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    n = sum(sizes)
    full = [torch.randn(1, n, d, generator=g) for d in (3, 2, 2)]
    off = sum(sizes[:rank])
    c, f, t = (from_local(a[:, off:off + sizes[rank]].clone(), mesh, [Shard(1)], sizes)
               for a in full)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(Transolver(3, 2, 2, n_hidden=16, n_layers=layers, heads=2, slices=8))
    model, ref = models
    fwd = model
    if compiled:
        fwd = torch.compile(model, backend="aot_eager")
        ((fwd(c, f) - t) ** 2).mean().backward()  # compiles
        model.zero_grad(set_to_none=True)
    loss, n_fwd = _all_reduces(lambda: ((fwd(c, f) - t) ** 2).mean())
    with bucket_weight_grads(bucket):
        _, n_bwd = _all_reduces(loss.backward)
    loss_ref = ((ref(full[0], full[1]) - full[2]) ** 2).mean()
    loss_ref.backward()
    grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters())]
    return {"n_fwd": n_fwd, "n_bwd": n_bwd, "n_params": sum(1 for _ in model.parameters()),
            "loss": (loss.full_tensor().detach(), loss_ref.detach()), "grads": grads}


class _Weights(torch.nn.Module):
    """Weights used every way the traced backward's one weight-gradient sum must get right:
    a linear used twice (tied), a linear without bias, a layer norm (weight and bias lifted
    together), and a parameter used with the points and in a plain path as well."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 8)
        self.b = torch.nn.Linear(8, 8, bias=False)
        self.ln = torch.nn.LayerNorm(8)
        self.s = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        h = self.b(torch.tanh(self.b(h)))
        h = self.ln(h) * self.s
        return self.head(h) * (self.s * z).sum()


def _weights_setup(rank: int, world_size: int, sizes, seed: int) -> tuple:
    """(1-d mesh, full X, Y, plain z, this rank's offset, model, its copy) in fp64."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    torch.set_default_dtype(torch.float64)
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    X, Y = torch.randn(1, n, 3, generator=g), torch.randn(1, n, 2, generator=g)
    z = torch.randn(8, generator=g)
    torch.manual_seed(0)
    model, ref = _Weights(), _Weights()
    ref.load_state_dict(model.state_dict())
    return mesh, X, Y, z, sum(sizes[:rank]), model, ref


def weights_compiled(rank, world_size, sizes, compiled, bucket=False):
    """:class:`_Weights` on ShardTensor points (fp64), eager or compiled (aot_eager): the
    backward's all-reduces (second step), and the gradients of every weight and of the points
    against one process; ``bucket``: the backward inside ``bucket_weight_grads()``."""

    from meshshard.shardtensor import Shard, bucket_weight_grads, from_local

    torch._dynamo.reset()
    mesh, X, Y, z, off, model, ref = _weights_setup(rank, world_size, sizes, 2)
    fwd = torch.compile(model, backend="aot_eager") if compiled else model

    def step():
        model.zero_grad(set_to_none=True)
        xl = X[:, off:off + sizes[rank]].clone().requires_grad_(True)
        x = from_local(xl, mesh, [Shard(1)], sizes)
        y = from_local(Y[:, off:off + sizes[rank]].clone(), mesh, [Shard(1)], sizes)
        loss = ((fwd(x, z) - y) ** 2).sum()
        with bucket_weight_grads(bucket):
            _, n = _all_reduces(loss.backward)
        return xl.grad, n

    step()
    xg, n_bwd = step()
    Xr = X.clone().requires_grad_(True)
    ((ref(Xr, z) - Y) ** 2).sum().backward()
    grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters())]
    grads.append((xg, Xr.grad[:, off:off + sizes[rank]]))
    return {"n_bwd": n_bwd, "grads": grads}


def weights_both(rank, world_size, layouts):
    """:func:`weights_compiled` eager, eager bucketed, compiled, for each layout: one spawn."""
    return [(weights_compiled(rank, world_size, sizes, False),
             weights_compiled(rank, world_size, sizes, False, True),
             weights_compiled(rank, world_size, sizes, True)) for sizes in layouts]


def eager_bucket_cases(rank, world_size, sizes):
    """Eager ``backward()`` / ``autograd.grad`` of :class:`_Weights` (fp64): what the weight-
    gradient bucket must keep as the per-layer sums had it, against one process:

    - ``grad``: ``torch.autograd.grad`` of the weights (all-reduces, values);
    - ``twice``: two ``backward`` calls without zeroing, ``.grad`` the sum of both (this and
      the next two inside ``bucket_weight_grads()``);
    - ``hooked``: a tensor hook on ``a.weight`` sees the global gradient (it keeps its
      per-node sum) and may scale it; a post-accumulate hook sees the final ``.grad``;
    - ``inputs``: ``backward(inputs=[...])`` fills only those ``.grad``.
    """
    from meshshard.shardtensor import Shard, bucket_weight_grads, from_local

    mesh, X, Y, z, off, model, ref = _weights_setup(rank, world_size, sizes, 3)
    x = from_local(X[:, off:off + sizes[rank]].clone(), mesh, [Shard(1)], sizes)
    y = from_local(Y[:, off:off + sizes[rank]].clone(), mesh, [Shard(1)], sizes)

    def loss_of(m, a, b):
        return ((m(a, z) - b) ** 2).sum()

    params = list(model.parameters())
    want = torch.autograd.grad(loss_of(ref, X, Y), list(ref.parameters()))
    out = {}
    got, n_grad = _all_reduces(lambda: torch.autograd.grad(loss_of(model, x, y), params))
    out["grad"] = (n_grad, list(zip(got, want)))
    # the same weights passed twice (lifted alone, and with the layer norm's bias): twice theirs
    s, lw, lb = model.s, model.ln.weight, model.ln.bias
    twice = torch.autograd.grad(loss_of(model, x, y), [s, lw, lb, s, lw])
    ks = [_index(params, t) for t in (s, lw, lb, s, lw)]
    out["same"] = [(got, want[k]) for got, k in zip(twice, ks)]

    model.zero_grad(set_to_none=True)
    for _ in range(2):
        with bucket_weight_grads():
            _, n_twice = _all_reduces(loss_of(model, x, y).backward)
    out["n_twice"] = n_twice
    out["twice"] = [(p.grad, 2 * w) for p, w in zip(params, want)]

    model.zero_grad(set_to_none=True)
    seen, after = [], []
    h1 = model.a.weight.register_hook(lambda t: (seen.append(t.clone()), 3 * t)[1])
    h2 = model.b.weight.register_post_accumulate_grad_hook(lambda p: after.append(p.grad.clone()))
    with bucket_weight_grads():
        loss_of(model, x, y).backward()
    h1.remove()
    h2.remove()
    scale = [3.0 if p is model.a.weight else 1.0 for p in params]
    out["hooked"] = ([(p.grad, s * w) for p, s, w in zip(params, scale, want)]
                     + [(seen[0], want[_index(params, model.a.weight)]),
                        (after[0], want[_index(params, model.b.weight)])])
    out["n_seen"] = (len(seen), len(after))

    model.zero_grad(set_to_none=True)
    only = [model.b.weight, model.s]
    with bucket_weight_grads():
        loss_of(model, x, y).backward(inputs=only)
    out["inputs"] = [(p.grad, w) for p, w in zip(params, want) if any(p is q for q in only)]
    out["untouched"] = [p.grad is None for p in params if not any(p is q for q in only)]
    return out


def _index(params: list, p: torch.Tensor) -> int:
    return next(k for k, q in enumerate(params) if q is p)


def eager_bucket_layouts(rank, world_size, layouts):
    """:func:`eager_bucket_cases` for each of ``layouts``: one spawn of ranks."""
    return [eager_bucket_cases(rank, world_size, sizes) for sizes in layouts]
