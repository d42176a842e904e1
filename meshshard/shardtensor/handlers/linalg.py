"""Contractions: einsum, matmul/mm/bmm/@, linear.

One rule for all of them, phrased on einsum letters: a sharded letter that survives into the
output shards the output along it; a sharded letter that is contracted makes the output
Partial(sum) (all-reduced later, only where needed). Replicated operands that carry the sharded
letter at full size are cut to the local rows; the others get their gradient summed over the
mesh dim in backward.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._generic import pointwise_apply
from meshshard.shardtensor._layout import LayoutError, check_same_mesh, reduce_partials, wrap
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import register_handler
from meshshard.shardtensor.spec import ShardSpec, mesh_group


def _placement(t, i):
    return t._spec.placements[i] if isinstance(t, ShardTensor) else Replicate()


def _gshape(t):
    return t._spec.shape if isinstance(t, ShardTensor) else t.shape


def contract(
    local_fn: Callable,
    operands: Sequence,
    letters: Sequence[str],
    out_letters: str,
    name: str,
):
    """Apply ``local_fn`` to local pieces of ``operands`` labelled with einsum ``letters``."""
    operands = list(operands)
    sts = [o for o in operands if isinstance(o, ShardTensor)]
    mesh = check_same_mesh(sts)
    # Partial inputs are reduced before a contraction (once per tensor: reduce_partials caches),
    # so a Partial feeding several projections costs one all-reduce, not one per result.
    operands = [reduce_partials(o) if isinstance(o, ShardTensor) else o for o in operands]
    # a letter sharded with different sizes in two operands: move rows to the first's layout
    for i in range(mesh.ndim if len(sts) > 1 else 0):
        first = {}
        for k, (o, L) in enumerate(zip(operands, letters)):
            p = _placement(o, i)
            if not isinstance(p, Shard):
                continue
            c = L[p.dim]
            if c not in first:
                first[c] = o._spec.sizes[i]
            elif o._spec.sizes[i] != first[c] and sum(o._spec.sizes[i]) == sum(first[c]):
                tgt = list(o._spec.sizes)
                tgt[i] = first[c]
                operands[k] = o.redistribute(o._spec.placements, tgt)
    key = _plan_key(operands, letters, out_letters)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None or plan[0].mesh is not mesh:
        plan = _plan(mesh, operands, letters, out_letters, name)
        if key is not None:
            if len(_PLANS) > _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan
    spec_out, actions = plan
    locals_ = []
    for o, act in zip(operands, actions):
        local = o._local if isinstance(o, ShardTensor) else o
        for kind, i, d, sizes in act:
            if kind == "split":
                local = C.split_local(local, d, sizes, mesh_group(mesh, i))
            else:
                local = C.grad_all_reduce(local, [mesh_group(mesh, j) for j in i])
        locals_.append(local)
    out = local_fn(*locals_)
    return wrap(out, spec_out)


def _plan(mesh, operands, letters, out_letters, name):
    """The layout decision of :func:`contract` (output spec and what to do to each operand),
    from the operands' layouts alone: cached by :func:`_plan_key`."""
    sizes_of: dict[str, int] = {}
    for o, L in zip(operands, letters):
        for c, s in zip(L, _gshape(o)):
            sizes_of[c] = max(sizes_of.get(c, 1), int(s))
    out_shape = torch.Size([sizes_of[c] for c in out_letters])
    placements, sizes, shard_letter = [], [], []
    for i in range(mesh.ndim):
        letter, lsizes, partial = None, None, False
        for o, L in zip(operands, letters):
            p = _placement(o, i)
            if isinstance(p, Shard):
                c = L[p.dim]
                if letter is None:
                    letter, lsizes = c, o._spec.sizes[i]
                elif c != letter or o._spec.sizes[i] != lsizes:
                    msg = (
                        f"{name}: operands are sharded on different indices or sizes along mesh "
                        f"dim {i} ({letter}{list(lsizes)} vs {c}{list(o._spec.sizes[i])}); "
                        "redistribute one to match the other"
                    )
                    raise LayoutError(msg)
            elif isinstance(p, Partial):
                partial = True
        shard_letter.append(letter)
        if letter is not None and letter in out_letters:
            placements.append(Shard(out_letters.index(letter)))
            sizes.append(lsizes)
        elif letter is not None or partial:
            placements.append(Partial("sum"))
            sizes.append(None)
        else:
            placements.append(Replicate())
            sizes.append(None)
    actions = []
    for o, L in zip(operands, letters):
        lshape = _lshape(o)
        act: list = []
        groups = []
        for i in range(mesh.ndim):
            if isinstance(placements[i], Replicate) or not isinstance(_placement(o, i), Replicate):
                continue
            c = shard_letter[i]
            if c is not None and c in L and lshape[L.index(c)] != 1:
                act.append(("split", i, L.index(c), sizes_of_mesh(operands, letters, i, c)))
            else:
                groups.append(i)
        if groups:
            act.append(("grad", tuple(groups), None, None))
        actions.append(tuple(act))
    return ShardSpec(mesh, tuple(placements), tuple(sizes), out_shape), tuple(actions)


_PLANS: dict = {}
_PLANS_MAX = 4096


def _lshape(o) -> tuple:
    return tuple(o._spec.local_shape()) if isinstance(o, ShardTensor) else tuple(o.shape)


def _plan_key(operands, letters, out_letters):
    """Everything :func:`_plan` reads: the letters and, per operand, its layout (mesh,
    placements, every rank's sizes, global shape) or its plain shape. ``None`` if unhashable."""
    parts = []
    for o in operands:
        if isinstance(o, ShardTensor):
            sp = o._spec
            parts.append((id(sp.mesh), sp.placements, sp.sizes, tuple(sp.shape)))
        elif isinstance(o, torch.Tensor):
            parts.append(("T", tuple(o.shape)))
        else:
            return None
    key = (tuple(letters), out_letters, tuple(parts))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def sizes_of_mesh(operands, letters, i, c):
    for o, L in zip(operands, letters):
        p = _placement(o, i)
        if isinstance(p, Shard) and L[p.dim] == c:
            return o._spec.sizes[i]
    msg = "internal: no sharded operand for letter"
    raise RuntimeError(msg)


def _parse_einsum(eq: str, ndims: Sequence[int]) -> tuple[list[str], str]:
    key = (eq, tuple(ndims))
    hit = _EINSUM_PARSED.get(key)
    if hit is None:
        hit = _parse_einsum_uncached(eq, ndims)
        if len(_EINSUM_PARSED) < 1024:
            _EINSUM_PARSED[key] = hit
    return list(hit[0]), hit[1]


_EINSUM_PARSED: dict = {}


def _parse_einsum_uncached(eq: str, ndims: Sequence[int]) -> tuple[list[str], str]:
    eq = eq.replace(" ", "")
    if "->" in eq:
        lhs, out = eq.split("->")
    else:
        lhs, out = eq, None
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        msg = f"einsum equation {eq!r} has {len(terms)} operands, got {len(ndims)} tensors"
        raise ValueError(msg)
    used = set(c for c in eq if c.isalpha())
    spare = [c for c in string.ascii_letters if c not in used]
    ell_n = 0
    for t, n in zip(terms, ndims):
        if "..." in t:
            ell_n = max(ell_n, n - (len(t) - 3))
    ell = "".join(spare[:ell_n])
    res = []
    for t, n in zip(terms, ndims):
        if "..." in t:
            k = n - (len(t) - 3)
            t = t.replace("...", ell[ell_n - k :])
        res.append(t)
    if out is None:
        counts: dict[str, int] = {}
        for t in res:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    else:
        out = out.replace("...", ell)
    return res, out


@register_handler(torch.einsum)
def _einsum(eq, *operands):
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    letters, out = _parse_einsum(eq, [len(_gshape(o)) for o in operands])
    return contract(
        lambda *ls: torch.einsum(eq, *ls), operands, letters, out, f"einsum({eq!r})"
    )


def _matmul_letters(na: int, nb: int) -> tuple[str, str, str]:
    if na == 1 and nb == 1:
        return "k", "k", ""
    batch = "abcdefgh"
    if na == 1:
        bb = batch[: nb - 2]
        return "k", bb + "kn", bb + "n"
    if nb == 1:
        ba = batch[: na - 2]
        return ba + "mk", "k", ba + "m"
    nbatch = max(na, nb) - 2
    full = batch[:nbatch]
    la = full[nbatch - (na - 2) :] + "mk"
    lb = full[nbatch - (nb - 2) :] + "kn"
    return la, lb, full + "mn"


def _matmul_like(fn, name):
    def handler(a, b, *, out=None):
        if out is not None:
            msg = f"{name}(out=...) is not supported for ShardTensors"
            raise NotImplementedError(msg)
        la, lb, lo = _matmul_letters(len(_gshape(a)), len(_gshape(b)))
        return contract(fn, (a, b), (la, lb), lo, name)

    return handler


register_handler(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)(
    _matmul_like(torch.matmul, "matmul")
)
register_handler(torch.Tensor.__rmatmul__)(
    lambda a, b: _matmul_like(torch.matmul, "matmul")(b, a)
)
register_handler(torch.mm, torch.Tensor.mm)(_matmul_like(torch.mm, "mm"))
register_handler(torch.bmm, torch.Tensor.bmm)(_matmul_like(torch.bmm, "bmm"))


def _linear_rowlocal(spec: ShardSpec, out_features: int):
    """Layout of ``F.linear`` on an input with ``spec`` that has no Partial and no Shard on its
    last dim, with a plain 2-d weight: the output keeps the input's placements and sizes; the
    weight and bias get their gradients summed over every non-replicated mesh dim (what
    :func:`contract` decides for this case). Remembered on the input spec."""
    def make():
        shape = torch.Size((*spec.shape[:-1], out_features))
        dims = tuple(i for i, p in enumerate(spec.placements) if not isinstance(p, Replicate))
        out = ShardSpec(spec.mesh, spec.placements, spec.sizes, shape)
        return out, [mesh_group(spec.mesh, i) for i in dims]

    return spec.derived(("linear", out_features), make)


def _linear_fast(x, weight, bias):
    spec = x._spec
    nx = len(spec.shape)
    if nx < 2 or spec.has_partial():
        return None
    for p in spec.placements:
        if isinstance(p, Shard) and p.dim == nx - 1:
            return None
    spec_out, groups = _linear_rowlocal(spec, weight.shape[0])
    if groups:
        weight = C.grad_all_reduce(weight, groups)
        if bias is not None:
            bias = C.grad_all_reduce(bias, groups)
    return wrap(F.linear(x._local, weight, bias), spec_out)


@register_handler(F.linear)
def _linear(x, weight, bias=None):
    if (
        type(x) is ShardTensor
        and not isinstance(weight, ShardTensor)
        and isinstance(weight, torch.Tensor)
        and weight.ndim == 2
        and (bias is None or (isinstance(bias, torch.Tensor)
                              and not isinstance(bias, ShardTensor) and bias.ndim == 1))
    ):
        out = _linear_fast(x, weight, bias)
        if out is not None:
            return out
    nx = len(_gshape(x))
    lx = "abcdefgh"[: nx - 1] + "i"
    lo = "abcdefgh"[: nx - 1] + "o"
    lw = "oi" if len(_gshape(weight)) == 2 else "i"
    if len(_gshape(weight)) == 1:
        lo = lo[:-1]
    fused = bias is not None and isinstance(x, ShardTensor) and not any(
        isinstance(p, Partial) or (isinstance(p, Shard) and p.dim == nx - 1)
        for p in x._spec.placements
    )
    if fused or (bias is not None and not isinstance(x, ShardTensor)):
        lb = "o" if len(_gshape(bias)) == 1 else ""
        return contract(
            lambda xl, wl, bl: F.linear(xl, wl, bl), (x, weight, bias), (lx, lw, lb), lo, "linear"
        )
    y = contract(lambda xl, wl: F.linear(xl, wl), (x, weight), (lx, lw), lo, "linear")
    if bias is None:
        return y
    # contraction over the sharded dim: add the bias once, after the reduction
    return pointwise_apply(torch.add, (y, bias), {})


__all__ = ["contract"]
