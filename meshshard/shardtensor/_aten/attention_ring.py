"""Exact attention over key/value blocks held by different ranks (ring attention), on local
tensors, forward and backward: what the opaque custom ops ``meshshard::ring_attention`` and
``meshshard::ring_attention_backward`` (:mod:`meshshard.shardtensor.rules.attention`) run,
in ``no_grad``.

Each rank keeps its query rows. Key/value blocks travel round the ring of the group in ``P - 1``
shifts; each shift is started before the block in hand is computed, so transfer and compute
overlap. Block results are merged exactly with the log-sum-exp (online softmax). No rank holds
K/V at full size or a score matrix larger than (local queries) x (one block); with torch's CPU
flash kernel the block itself is tiled, so not even that.

Memory: besides its results (``out``; ``dq``, ``dk``, ``dv``) a rank holds only transients that
do not grow with the local queries or keys: a ring pass carries ``KV_CHUNK_ROWS`` key rows
(``GPU_BLOCK_SCALE`` times more on a GPU, where launches, not memory, bound the block size) of
one head, in two flat buffers allocated once per call and reused by every shift (the block in
hand and the one arriving; backward adds two for the dK/dV partial sums), and each block is
computed in tiles of ``Q_TILE_ROWS`` query rows, so a block's output and ``dq`` are tile-sized.
Few, reused allocations also leave no freed blocks behind to fragment the heap, which showed as
resident memory well above the live tensors.

Backward saves only ``q, k, v, out, lse``. It recomputes each block's probabilities from the
global log-sum-exp, accumulates ``dq`` locally, and sends the ``dk``/``dv`` partial sums round the
ring behind the blocks (they start at the owner's successor), so that after ``P - 1`` shifts each
owner holds the exact gradient of its rows
(the flash backward of one block, given the *global* ``out`` and ``lse``, is that block's exact
share of the gradient).

Three modes (:class:`AttnPlan`): ``"ring"`` (queries and keys sharded on the same group),
``"local"`` (keys and values whole on this rank) and ``"merge"`` (queries whole on every rank,
keys sharded: each rank attends to its own block and the results are merged by log-sum-exp with
two all-reduces; backward all-reduces ``dq``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from meshshard.comm.ring import DoubleBuffer, Ring, Shift
from meshshard.shardtensor._aten.attention_block import (
    _acc_dtype,
    _block_bwd,
    _block_fwd,
    _expand,
    _fold,
    _merge_,
)

__all__ = ["KV_CHUNK_ROWS", "Q_TILE_ROWS", "AttnPlan", "backward", "forward"]

KV_CHUNK_ROWS = 1024  # key rows per rank per ring pass (bounds the transient buffers)
Q_TILE_ROWS = 2048  # query rows per block call (bounds the block's output and dq)
# on a GPU each kernel launch costs about as much as a small block: blocks 16x larger (the fused
# kernels hold no score matrix, so memory still grows with the rows only)
GPU_BLOCK_SCALE = 16


def _block_rows(rows: int, device: torch.device) -> int:
    """``rows`` (a CPU block size) sized for ``device``."""
    return rows * GPU_BLOCK_SCALE if device.type == "cuda" else rows


@dataclass(frozen=True)
class AttnPlan:
    """What one rank needs to know to compute its share of attention.

    Attributes
    ----------
    mode : {"ring", "local", "merge"}
    ring : Ring
        The group that holds the key/value blocks (size 1 for ``"local"``).
    kv_sizes : tuple of int
        Key rows of every ring rank, in ring order (``(Lk,)`` for ``"local"``).
    q_offset : int
        Global index of this rank's first query row (for ``causal``).
    mask : Tensor or None
        Additive mask (query dtype) of shape broadcastable to ``(B, H, Lq_local, n)``: rows are
        this rank's query rows (or 1), columns are keys ``[mask_col0, mask_col0 + n)`` in global
        order (all keys, or in mode ``"merge"`` this rank's own block).
    causal : bool
        Key ``j`` is visible to query ``i`` iff ``j <= i`` in global indices (torch's top-left
        ``is_causal`` convention).
    scale : float
    gqa_groups : int
        Query heads per key/value head (1 without grouped heads).
    mask_col0 : int
        Global index of the mask's first key column.
    """

    mode: str
    ring: Ring
    kv_sizes: tuple
    q_offset: int
    mask: torch.Tensor | None
    causal: bool
    scale: float
    gqa_groups: int = 1
    mask_col0: int = 0

    def kv_offset(self, owner: int) -> int:
        return int(sum(self.kv_sizes[:owner]))


# ---------------------------------------------------------------------------- block tiles
def _q_tiles(q_len: int, device: torch.device):
    """Slices of at most ``Q_TILE_ROWS`` local query rows (x ``GPU_BLOCK_SCALE`` on a GPU): a
    block's output, ``dq`` and kernel buffers are computed one tile at a time, so they stay a
    fraction of the local queries."""
    step = max(1, _block_rows(Q_TILE_ROWS, device))
    return [slice(r, min(r + step, q_len)) for r in range(0, q_len, step)]


def _block_mask(plan: AttnPlan, mask, r0: int, q_len: int, k0: int, n: int, like: torch.Tensor):
    """(additive mask or None, kernel causal flag, skip) for local query rows
    ``[r0, r0 + q_len)`` and keys ``[k0, k0 + n)``."""
    c0 = k0 - plan.mask_col0
    m = None if mask is None else mask[..., c0 : c0 + n]
    if m is not None and m.shape[-2] != 1:
        m = m[..., r0 : r0 + q_len, :]
    if not plan.causal:
        return m, False, False
    q0 = plan.q_offset + r0
    if k0 > q0 + q_len - 1:
        return None, False, True  # every key comes after every query
    if k0 + n - 1 <= q0:
        return m, False, False  # every key visible
    if k0 == q0 and m is None:
        return None, True, False  # same origin: the kernel's top-left causal mask is exact
    qi = torch.arange(q0, q0 + q_len, device=like.device)[:, None]
    kj = torch.arange(k0, k0 + n, device=like.device)[None, :]
    c = torch.zeros((q_len, n), dtype=like.dtype, device=like.device)
    c = c.masked_fill(kj > qi, float("-inf"))
    return (c if m is None else m + c), False, False


# ---------------------------------------------------------------------------- passes
def _pack_into(buf: torch.Tensor, *ts: torch.Tensor) -> torch.Tensor:
    """Copy ``ts`` one after the other into the flat ``buf``; returns the filled front."""
    at = 0
    for t in ts:
        n = t.numel()
        buf[at : at + n].view(t.shape).copy_(t)
        at += n
    return buf[:at]


def _ring_buffers(plan: AttnPlan, k, v, dtype) -> DoubleBuffer | None:
    """Double buffers sized for the largest key block of any pass (``None`` unless ring)."""
    if plan.mode != "ring" or plan.ring.size == 1:
        return None
    rows = max((max(sub, default=0) for *_, sub, _ in _passes(plan, k)), default=0)
    return DoubleBuffer(_numel(_kv_shapes(k, v, rows)), dtype, k.device)


def _kv_shapes(k, v, n):
    """Shapes of one pass's key and value block (one key/value head, ``n`` rows)."""
    return [(k.shape[0], 1, n, k.shape[-1]), (v.shape[0], 1, n, v.shape[-1])]


def _numel(shapes) -> int:
    return sum(math.prod(s) for s in shapes)


def _unpack(buf: torch.Tensor, shapes):
    out, at = [], 0
    for s in shapes:
        n = math.prod(s)
        out.append(buf[at : at + n].view(s))
        at += n
    return out


def _split_sizes(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


def _passes(plan: AttnPlan, k: torch.Tensor):
    """Independent ring passes: one per key/value head and key chunk, so that every transient
    buffer (blocks in flight, block results, gradient partial sums) is a fraction of the
    local K/V. Yields (query head slice, kv head, key chunk slice of the local rows, per-owner
    chunk sizes, per-owner global chunk starts)."""
    sizes = (k.shape[-2],) if plan.mode == "local" else tuple(plan.kv_sizes)
    chunks = max(1, -(-max(sizes, default=0) // _block_rows(KV_CHUNK_ROWS, k.device)))
    split = [_split_sizes(n, chunks) for n in sizes]
    me = 0 if plan.mode == "local" else plan.ring.rank
    g = plan.gqa_groups
    for h in range(k.shape[1]):
        for c in range(chunks):
            sub = tuple(sp[c] for sp in split)
            starts = tuple((0 if plan.mode == "local" else plan.kv_offset(o)) + sum(sp[:c])
                           for o, sp in enumerate(split))
            lo = sum(split[me][:c])
            yield slice(h * g, (h + 1) * g), h, slice(lo, lo + sub[me]), sub, starts


def _owners(plan: AttnPlan) -> list[int]:
    if plan.mode == "ring":
        return [plan.ring.owner(s) for s in range(plan.ring.size)]
    return [0 if plan.mode == "local" else plan.ring.rank]


def _head_mask(plan: AttnPlan, hs: slice):
    m = plan.mask
    if m is None or m.shape[1] == 1:
        return m
    return m[:, hs]


# ---------------------------------------------------------------------------- forward
def forward(q, k, v, plan: AttnPlan):
    """(out, lse) in the accumulation dtype of this rank's queries over every rank's keys.
    Collective over ``plan.ring`` in modes ``"ring"`` and ``"merge"``."""
    acc = _acc_dtype(q.dtype)
    b, h, lq, _ = q.shape
    out = torch.zeros((b, h, lq, v.shape[-1]), dtype=acc, device=q.device)
    lse = torch.full((b, h, lq), float("-inf"), dtype=acc, device=q.device)
    ring_mode = plan.mode == "ring"
    owners = _owners(plan)
    bufs = _ring_buffers(plan, k, v, k.dtype)
    for hs, hk, rows, sub, starts in _passes(plan, k):
        qh, oh, lh = q[:, hs], out[:, hs], lse[:, hs]
        mask = _head_mask(plan, hs)
        kv = (k[:, hk : hk + 1, rows], v[:, hk : hk + 1, rows])
        cur = _pack_into(bufs.this(), *kv) if bufs is not None else None
        for s, o in enumerate(owners):
            n = sub[o]
            pend = None
            if ring_mode and s < len(owners) - 1:
                n_next = sub[owners[s + 1]]
                pend = plan.ring.shift(cur if n else None, _numel(_kv_shapes(k, v, n_next)),
                                       dtype=k.dtype, device=k.device,
                                       into=bufs.other())
            if n:
                kb, vb = _unpack(cur, _kv_shapes(k, v, n)) if bufs is not None else kv
                kb, vb = _expand(kb, plan.gqa_groups), _expand(vb, plan.gqa_groups)
                for rs in _q_tiles(lq, q.device):
                    m, kc, skip = _block_mask(plan, mask, rs.start, rs.stop - rs.start,
                                              starts[o], n, q)
                    if skip:
                        continue
                    o_b, lse_b = _block_fwd(qh[..., rs, :], kb, vb, m, kc, plan.scale)
                    _merge_(oh[..., rs, :], lh[..., rs], o_b, lse_b)
                    del o_b, lse_b
            if pend is not None:
                cur = pend.wait()
                bufs.swap()
                del pend
    if plan.mode == "merge" and plan.ring.size > 1:
        out, lse = _merge_across(out, lse, plan.ring.group)
    return out, lse


def _reduce(t: torch.Tensor, op, group) -> torch.Tensor:
    out = t.clone().contiguous()
    dist.all_reduce(out, op=op, group=group)
    return out


def _merge_across(out, lse, group):
    """Exact log-sum-exp merge of every rank's (out, lse) for the same queries."""
    top = _reduce(lse, dist.ReduceOp.MAX, group)
    top = torch.where(torch.isneginf(top), 0, top)
    total = _reduce(torch.exp(lse - top), dist.ReduceOp.SUM, group)
    glse = torch.log(total) + top
    safe = torch.where(torch.isneginf(glse), 0, glse)
    out = _reduce(out * torch.exp(lse - safe)[..., None], dist.ReduceOp.SUM, group)
    return out, glse


# ---------------------------------------------------------------------------- backward
def backward(do, q, k, v, out, lse, plan: AttnPlan):
    """(dq, dk, dv) given the global ``out`` and ``lse`` of :func:`forward`. Collective like
    it."""
    acc = _acc_dtype(q.dtype)
    lq = q.shape[-2]
    lse = torch.where(torch.isneginf(lse), 0, lse)  # rows with no visible key: p = 0
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    owners = _owners(plan)
    g = plan.gqa_groups
    bufs = _ring_buffers(plan, k, v, k.dtype)  # key/value blocks
    sums = _ring_buffers(plan, k, v, acc)  # dk/dv partial sums travelling behind them
    for hs, hk, rows, sub, starts in _passes(plan, k):
        qh, doh, outh, lseh, dqh = q[:, hs], do[:, hs], out[:, hs], lse[:, hs], dq[:, hs]
        dkh, dvh = dk[:, hk : hk + 1, rows], dv[:, hk : hk + 1, rows]
        mask = _head_mask(plan, hs)
        kv = (k[:, hk : hk + 1, rows], v[:, hk : hk + 1, rows])
        cur = _pack_into(bufs.this(), *kv) if bufs is not None else None
        last = None  # (partial sums of the previous block, its rows): sent with the next batch
        for s, o in enumerate(owners):
            n = sub[o]
            shapes = _kv_shapes(k, v, n)
            n_next = sub[owners[(s + 1) % len(owners)]]
            # one batch per step: the next key/value block, and (from the third step) the
            # previous block's dk/dv partial sums out and this block's in
            items = []
            if bufs is not None and s < len(owners) - 1:
                items.append(Shift(cur if n else None, _numel(_kv_shapes(k, v, n_next)),
                                   k.dtype, k.device, bufs.other()))
            if sums is not None and s >= 2:
                items.append(Shift(last[0] if last[1] else None, _numel(shapes), acc,
                                   q.device, sums.other()))
            batch = plan.ring.shifts(items) if items else None
            dk_b = dv_b = None  # this block's dk/dv share, summed over the query tiles
            if n:
                kb, vb = _unpack(cur, shapes) if bufs is not None else kv
                kb, vb = _expand(kb, g), _expand(vb, g)
                for rs in _q_tiles(lq, q.device):
                    m, kc, skip = _block_mask(plan, mask, rs.start, rs.stop - rs.start,
                                              starts[o], n, q)
                    if skip:
                        continue
                    dq_t, dk_t, dv_t = _block_bwd(doh[..., rs, :], qh[..., rs, :], kb, vb,
                                                  outh[..., rs, :], lseh[..., rs], m, kc,
                                                  plan.scale)
                    dqh[..., rs, :] += dq_t
                    del dq_t
                    dk_t, dv_t = _fold(dk_t, g), _fold(dv_t, g)
                    if s == 0 or sums is None:  # own block (or no ring): into the result
                        dkh += dk_t
                        dvh += dv_t
                    elif dk_b is None:  # summed over tiles in the accumulation dtype
                        dk_b, dv_b = dk_t.to(acc), dv_t.to(acc)
                    else:
                        dk_b += dk_t
                        dv_b += dv_t
                    del dk_t, dv_t
            got = batch.wait() if batch is not None else []
            del batch
            if bufs is not None and s < len(owners) - 1:
                cur = got[0]
                bufs.swap()
            if s > 0 and sums is not None:  # the partial sums start at the next rank and
                if s == 1:  # end at the owner
                    buf = sums.this()[: _numel(shapes)].zero_()
                else:
                    buf = got[-1]
                    sums.swap()
                if dk_b is not None:
                    ak, av = _unpack(buf, shapes)
                    ak += dk_b
                    av += dv_b
                last = (buf, n)
                del buf
            del dk_b, dv_b, got
        if last is not None:  # the last block's sums go on; this rank's own come in
            fin = plan.ring.shifts([Shift(last[0] if last[1] else None,
                                          _numel(_kv_shapes(k, v, rows.stop - rows.start)),
                                          acc, q.device, sums.other())])
            rk, rv = _unpack(fin.wait()[0], _kv_shapes(k, v, rows.stop - rows.start))
            sums.swap()
            dkh += rk
            dvh += rv
            del fin, last
    if plan.mode == "merge" and plan.ring.size > 1:
        dq = _reduce(dq, dist.ReduceOp.SUM, plan.ring.group)
    return dq, dk, dv
