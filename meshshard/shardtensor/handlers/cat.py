"""cat / stack, and fetching rows by global index (index_select, __getitem__ on the sharded
dim)."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.collective_check import check_collective
from meshshard.shardtensor import collectives as C
from meshshard.shardtensor._layout import (
    LayoutError,
    align_sizes,
    check_same_mesh,
    reduce_partials,
    replicated_local,
    wrap,
)
from meshshard.shardtensor._tracemode import refuse
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import register_handler
from meshshard.shardtensor.spec import ShardSpec, even_sizes, intern_spec, mesh_group


def _gshape(t):
    return t._spec.shape if isinstance(t, ShardTensor) else t.shape


def _layout_of(tensors, skip_dim=None, name="cat"):
    """Common (placements, sizes) of the sharded operands; Partial reduced unless all share it."""
    sts = [t for t in tensors if isinstance(t, ShardTensor)]
    mesh = check_same_mesh(sts)
    out_p, out_s = [], []
    for i in range(mesh.ndim):
        kinds = [t._spec.placements[i] if isinstance(t, ShardTensor) else Replicate()
                 for t in tensors]
        if any(isinstance(k, Partial) for k in kinds) and not (
            all(isinstance(k, Partial) and k.reduce_op == "sum" for k in kinds)
        ):
            tensors = [reduce_partials(t, [i]) if isinstance(t, ShardTensor) else t
                       for t in tensors]
            kinds = [t._spec.placements[i] if isinstance(t, ShardTensor) else Replicate()
                     for t in tensors]
        shard = [(k, t._spec.sizes[i]) for k, t in zip(kinds, tensors) if isinstance(k, Shard)]
        if shard:
            k0, s0 = shard[0]
            for k, s in shard[1:]:
                if k != k0 or (k.dim != skip_dim and s != s0):
                    msg = (
                        f"{name}: operands are sharded differently on mesh dim {i} "
                        f"({k0}{list(s0)} vs {k}{list(s)}); redistribute one to match"
                    )
                    raise LayoutError(msg)
            out_p.append(k0)
            out_s.append(s0)
        elif any(isinstance(k, Partial) for k in kinds):
            out_p.append(Partial("sum"))
            out_s.append(None)
        else:
            out_p.append(Replicate())
            out_s.append(None)
    return mesh, tensors, out_p, out_s


@register_handler(torch.cat, torch.concat, torch.concatenate)
def _cat(tensors, dim=0, *, out=None):
    tensors = list(tensors)
    nd = len(_gshape(tensors[0]))
    d = dim + nd if dim < 0 else dim
    if not any(isinstance(t, ShardTensor) and t._spec.mesh_dim_of(d) is not None
               for t in tensors):
        # same sharded dim, different uneven sizes (a UNet skip vs its upsampled twin): move
        # rows to the first operand's layout (differentiable, collective) instead of failing
        tensors = [align_sizes(t, tensors, nd) if isinstance(t, ShardTensor) else t
                   for t in tensors]
    mesh, tensors, placements, sizes = _layout_of(tensors, skip_dim=d, name="cat")
    shape = list(_gshape(tensors[0]))
    shape[d] = sum(int(_gshape(t)[d]) for t in tensors)
    sharded_here = [i for i, p in enumerate(placements) if isinstance(p, Shard) and p.dim == d]
    if sharded_here:
        return _cat_sharded(tensors, d, sharded_here[0], mesh, placements, sizes, shape)
    spec = intern_spec(ShardSpec(mesh, tuple(placements), tuple(sizes), torch.Size(shape)))
    aligned = {i: p.dim for i, p in enumerate(placements) if isinstance(p, Shard)}
    locs = []
    for t in tensors:
        if isinstance(t, ShardTensor) and not t._spec.is_replicated():
            locs.append(t._local)
        else:
            locs.append(replicated_local(t, spec, aligned))
    return wrap(torch.cat(locs, d), spec)


def _cat_sharded(tensors, d, i, mesh, placements, sizes, shape):
    """cat along the sharded dim: result rank r holds sum_k sizes_k[r] rows; only rows whose
    owner changes move (one uneven all-to-all)."""
    group = mesh_group(mesh, i)
    n = mesh.size(i)
    me = mesh.get_local_rank(i)
    pieces, psizes = [], []
    for t in tensors:
        if isinstance(t, ShardTensor) and isinstance(t._spec.placements[i], Shard):
            pieces.append(t._local)
            psizes.append(t._spec.sizes[i])
        else:
            s = even_sizes(int(_gshape(t)[d]), n)
            local = t._local if isinstance(t, ShardTensor) else t
            pieces.append(C.split_local(local, d, s, group))
            psizes.append(s)
    target = tuple(int(sum(s[r] for s in psizes)) for r in range(n))
    toff = np.concatenate([[0], np.cumsum(target)])
    # global interval of every (source rank q, operand k)
    base = 0
    send_chunks, send_counts = [[] for _ in range(n)], [0] * n
    recv_meta = []  # (global_start, count, q) for every piece this rank receives
    for p, s in zip(pieces, psizes):
        off = np.concatenate([[0], np.cumsum(s)])
        for q in range(n):
            lo, hi = base + off[q], base + off[q + 1]
            for dst in range(n):
                a, b = max(lo, toff[dst]), min(hi, toff[dst + 1])
                if b <= a:
                    continue
                if q == me:
                    send_chunks[dst].append(p.narrow(d, int(a - lo), int(b - a)))
                    send_counts[dst] += int(b - a)
                if dst == me:
                    recv_meta.append((int(a), int(b - a), q))
        base += off[-1]
    send = [torch.cat(ch, d) if ch else pieces[0].narrow(d, 0, 0) for ch in send_chunks]
    buf = torch.cat(send, d).movedim(d, 0)
    recv_counts = [sum(c for _, c, q in recv_meta if q == src) for src in range(n)]
    got = C.all_to_all_v(buf, send_counts, recv_counts, group)
    # received pieces arrive grouped by source, each source's pieces in increasing position
    order = sorted(range(len(recv_meta)), key=lambda j: (recv_meta[j][2], recv_meta[j][0]))
    starts, pos = {}, 0
    for j in order:
        starts[j] = pos
        pos += recv_meta[j][1]
    by_pos = sorted(range(len(recv_meta)), key=lambda j: recv_meta[j][0])
    parts = [got.narrow(0, starts[j], recv_meta[j][1]) for j in by_pos]
    local = (torch.cat(parts, 0) if parts else got[:0]).movedim(0, d)
    new_sizes = list(sizes)
    new_sizes[i] = target
    spec = intern_spec(ShardSpec(mesh, tuple(placements), tuple(new_sizes), torch.Size(shape)))
    return wrap(local, spec)


@register_handler(torch.stack)
def _stack(tensors, dim=0, *, out=None):
    tensors = list(tensors)
    nd = len(_gshape(tensors[0])) + 1
    d = dim + nd if dim < 0 else dim
    mesh, tensors, placements, sizes = _layout_of(tensors, name="stack")
    placements = [Shard(p.dim + 1 if p.dim >= d else p.dim) if isinstance(p, Shard) else p
                  for p in placements]
    shape = list(_gshape(tensors[0]))
    shape.insert(d, len(tensors))
    spec = intern_spec(ShardSpec(mesh, tuple(placements), tuple(sizes), torch.Size(shape)))
    aligned = {i: (p.dim if p.dim < d else p.dim - 1) for i, p in enumerate(placements)
               if isinstance(p, Shard)}
    locs = [t._local if isinstance(t, ShardTensor) and not t._spec.is_replicated()
            else replicated_local(t, spec, aligned) for t in tensors]
    return wrap(torch.stack(locs, d), spec)


# ---------------------------------------------------------------------------- row fetching
def fetch_rows(local, d, sizes, wanted, group, me):
    """Rows ``wanted`` (global indices along ``d``, int64 1-D, this rank's requests) of a
    tensor sharded with ``sizes`` along ``d``: each owner sends only the rows requested from it,
    once each. Differentiable (gradients flow back and add up at the owners). Collective."""
    n = len(sizes)
    off = torch.as_tensor(np.concatenate([[0], np.cumsum(sizes)]), dtype=torch.int64)
    uniq, inv = torch.unique(wanted.cpu(), return_inverse=True)
    uowner = torch.searchsorted(off[1:], uniq, right=True)
    req_counts = torch.bincount(uowner, minlength=n)
    cnt_in = _exchange_counts(req_counts, group, local)
    req_in = C._a2a(uniq.to(_dev(group, local)), req_counts.tolist(), cnt_in.tolist(), group)
    lo = int(off[me])
    rows = local.movedim(d, 0).index_select(0, (req_in - lo).to(local.device))
    back = C.all_to_all_v(rows, cnt_in.tolist(), req_counts.tolist(), group)
    return back.index_select(0, inv.to(back.device)).movedim(0, d)


def _dev(group, like):
    backend = dist.get_backend(group)
    return like.device if backend == "nccl" else torch.device("cpu")


def _exchange_counts(counts, group, like):
    n = counts.numel()
    if n == 1:
        return counts.clone()
    refuse("an exchange of row counts (output sizes that depend on the data)")
    dev = _dev(group, like)
    out = torch.empty(n, dtype=torch.int64, device=dev)
    check_collective("all_to_all_single", group, out, detail="row counts")
    dist.all_to_all_single(out, counts.to(dev), group=group)
    return out.cpu()


@register_handler(torch.index_select, torch.Tensor.index_select)
def _index_select(x, dim, index):
    x = reduce_partials(x)
    spec = x._spec
    d = dim + spec.ndim if dim < 0 else dim
    i = spec.mesh_dim_of(d)
    if isinstance(index, ShardTensor):
        if not index._spec.is_replicated():
            msg = "index_select with a sharded index: use meshshard.ops.gather_neighbors"
            raise LayoutError(msg)
        index = index._local
    if i is None:
        return wrap(x._local.index_select(d, index.to(x._local.device)),
                    spec.with_changes(shape=_with(spec.shape, d, index.numel())))
    return _select_rows(x, d, i, index.reshape(-1).to(torch.int64))


def _with(shape, d, v):
    s = list(shape)
    s[d] = v
    return torch.Size(s)


def _select_rows(x, d, i, index):
    """Rows ``index`` (global, replicated) along sharded dim ``d``. Sorted indices stay where
    they are (no data moves); otherwise the result is split evenly and rows are fetched."""
    spec = x._spec
    mesh = spec.mesh
    group = mesh_group(mesh, i)
    me = mesh.get_local_rank(i)
    n = mesh.size(i)
    N = spec.shape[d]
    if index.numel() and (int(index.min()) < -N or int(index.max()) >= N):
        msg = f"index out of range for the sharded dim {d} of size {N}"
        raise IndexError(msg)
    index = torch.where(index < 0, index + N, index)
    off = np.concatenate([[0], np.cumsum(spec.sizes[i])])
    if index.numel() <= 1 or bool((index[1:] >= index[:-1]).all()):
        bounds = torch.as_tensor(off, dtype=torch.int64)
        cuts = torch.searchsorted(index.cpu(), bounds, right=False).tolist()
        out_sizes = tuple(cuts[r + 1] - cuts[r] for r in range(n))
        mine = index[cuts[me] : cuts[me + 1]] - int(off[me])
        local = x._local.index_select(d, mine.to(x._local.device))
    else:
        out_sizes = even_sizes(index.numel(), n)
        start = sum(out_sizes[:me])
        wanted = index[start : start + out_sizes[me]]
        local = fetch_rows(x._local, d, spec.sizes[i], wanted, group, me)
    sizes = list(spec.sizes)
    sizes[i] = out_sizes
    return wrap(local, ShardSpec(mesh, spec.placements, tuple(sizes),
                                 _with(spec.shape, d, index.numel())))
