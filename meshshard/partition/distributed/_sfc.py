"""Distributed Morton / Hilbert partitioning: a sample sort of ``(code, global row)`` keys.

1. global bounding box (all_reduce min/max) and ``bits`` from the global N, so every rank
   quantises and encodes exactly as :func:`meshshard.partition.sfc.hilbert` would;
2. local stable sort by code (local rows are in global-row order, so ties go by row);
3. splitters from regular samples (one all_gather), then one all_to_all of
   ``(code, row[, weight])``: rank r now holds the r-th contiguous block of the global curve;
4. cut positions from the global positions (or a prefix sum of the weights), as in
   :func:`meshshard.partition.sfc.split_curve`;
5. one all_to_all of rows to the rank owning their part (``order`` pieces) and one back to the
   input rank (stored position of every input row).
"""

from __future__ import annotations

import numpy as np

from meshshard.comm.host import Comm
from meshshard.partition.distributed._keys import torch_codes
from meshshard.partition.distributed._mem import index_dtype, trim_heap
from meshshard.partition.distributed._record import DistributedPartition, owner_counts
from meshshard.partition.sfc import _ENCODERS, _encode, _ensure_nonempty, bounding_box

__all__ = ["sfc_partition", "global_box"]

SAMPLES_PER_RANK = 64
#: (code, row) keys pack into one int64 when they need at most this many bits (tests lower it
#: to run the general path that very large inputs take)
PACK_BITS = 63
#: compute keys with torch even for CPU tensors (tests; CUDA tensors always use torch)
TORCH_KEYS = False
STEP = 1 << 18  # rows per step of the chunked passes (no full-size temporaries)


#: rows encoded per step: the float64 grid coordinates and codes of one step stay small, so
#: encoding adds only the int64 code array (8 bytes per row) to the input
ENCODE_CHUNK = 1 << 18


def encode(pts, bits, method, lo, hi, tensor=None) -> np.ndarray:
    """int64 curve codes on the global box: with torch on the tensor's device when the input
    was a CUDA tensor (or ``TORCH_KEYS``), else with the numpy encoder (same bits). Chunked:
    no full-size quantised copy of the points."""
    n = pts.shape[0]
    out = np.empty(n, dtype=np.int64)
    use_torch = tensor is not None and (tensor.device.type != "cpu" or TORCH_KEYS)
    for s in range(0, n, ENCODE_CHUNK):
        e = min(n, s + ENCODE_CHUNK)
        if use_torch:
            out[s:e] = torch_codes(tensor[s:e].detach(), bits, method, lo, hi).cpu().numpy()
        else:
            out[s:e] = _encode(pts[s:e], bits, _ENCODERS[method], bounds=(lo, hi)).view(np.int64)
    return out


def global_box(comm: Comm, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-axis float64 (min, max) over all ranks (collective); empty ranks give +-inf."""
    dim = pts.shape[1]
    if pts.shape[0]:
        lo, hi = bounding_box(pts)
    else:
        lo, hi = np.full(dim, np.inf), np.full(dim, -np.inf)
    comm.phase = "bounding box"
    both = comm.allreduce(np.concatenate([lo, -hi]), op="min")
    return both[:dim], -both[dim:]


def uniform_starts(n: int, targets: np.ndarray) -> np.ndarray:
    """``searchsorted(arange(n) + 0.5, cumsum(targets)[:-1] * n)`` without the O(n) array."""
    bounds = np.cumsum(targets)[:-1] * float(n)
    out = np.empty(bounds.size, dtype=np.int64)
    for j, b in enumerate(bounds.tolist()):
        i = int(min(max(np.ceil(b - 0.5), 0), n))
        while i > 0 and float(i - 1) + 0.5 >= b:
            i -= 1
        while i < n and float(i) + 0.5 < b:
            i += 1
        out[j] = i
    return out


def _lex_count_le(cs: np.ndarray, gs: np.ndarray, c: int, g: int) -> int:
    """Rows of the (code, row)-sorted ``cs, gs`` with key <= ``(c, g)``."""
    i = int(np.searchsorted(cs, c, side="left"))
    e = int(np.searchsorted(cs, c, side="right"))
    return i + int(np.searchsorted(gs[i:e], g, side="right"))


def _splitter_counts(comm: Comm, cs: np.ndarray, gs: np.ndarray, n_total: int) -> np.ndarray:
    """Rows of the local sorted keys bound for each rank (regular-sample splitters)."""
    W = comm.world
    n = cs.size
    s = 0
    if n:
        s = int(min(n, max(1, round(SAMPLES_PER_RANK * W * n / max(n_total, 1)))))
    pick = (np.arange(s, dtype=np.int64) * n) // max(s, 1)
    comm.phase = "splitters"
    samples = np.concatenate(comm.allgatherv(np.stack([cs[pick], gs[pick]], axis=1)))
    o = np.lexsort((samples[:, 1], samples[:, 0]))
    samples = samples[o]
    S = samples.shape[0]
    ends = np.empty(W, dtype=np.int64)
    for r in range(W - 1):
        at = ((r + 1) * S) // W
        if S == 0 or at == 0:
            ends[r] = 0
            continue
        c, g = samples[at - 1]
        ends[r] = _lex_count_le(cs, gs, int(c), int(g))
    ends[W - 1] = n
    return np.diff(np.concatenate([[0], ends]))


def sfc_partition(
    comm: Comm,
    pts: np.ndarray,
    w: np.ndarray | None,
    parts: int,
    targets: np.ndarray,
    counts: np.ndarray,
    *,
    method: str,
    bits: int,
    allow_empty: bool,
    lo: np.ndarray,
    hi: np.ndarray,
    tensor=None,
) -> DistributedPartition:
    """See :func:`meshshard.partition.distributed.partition_distributed` (collective)."""
    W, rank = comm.world, comm.rank
    n, dim = pts.shape
    N = int(counts.sum())
    off = int(counts[:rank].sum())
    idx_bits = max((N - 1).bit_length(), 1)
    if w is None and bits * dim + idx_bits <= PACK_BITS:
        # the keys are made inside, so no frame here keeps them alive once they are spent
        comm.phase = "encode"
        keys = [encode(pts, bits, method, lo, hi, tensor)]
        return _packed(comm, keys, idx_bits, parts, targets, counts, method, bits, allow_empty)
    # general path (weights, or code + row bits > 63): int64 codes, rows in the index dtype
    # and float64 weights travel as separate arrays; a stable sort breaks code ties by row
    idt = index_dtype(N)
    comm.phase = "encode"
    codes = encode(pts, bits, method, lo, hi, tensor)
    comm.phase = "local sort"
    lperm = np.argsort(codes, kind="stable").astype(idt)
    scodes = codes[lperm]
    del codes
    srow = lperm + idt(off)
    sw = None if w is None else w[lperm]
    send_counts = _splitter_counts(comm, scodes, srow, N)
    trim_heap()
    comm.phase = "sort exchange"
    rc, recv_counts = comm.alltoallv(scodes, send_counts)
    del scodes
    rg, _ = comm.alltoallv(srow, send_counts, recv_counts)
    del srow
    rw = None if sw is None else comm.alltoallv(sw, send_counts, recv_counts)[0]
    del sw
    # sources arrive in rank order, i.e. in row order: a stable sort breaks code ties by row
    comm.phase = "merge"
    rperm = np.argsort(rc, kind="stable")
    del rc
    g = rg[rperm]
    del rg
    ws = None if rw is None else rw[rperm]
    del rw
    m = g.size
    comm.phase = "cut positions"
    blocks = comm.allgather(np.array([m], dtype=np.int64))[:, 0]
    bo = int(blocks[:rank].sum())
    if ws is None:
        starts = uniform_starts(N, targets)
    else:
        totals = comm.allgather(np.array([ws.sum() if m else 0.0]))[:, 0]
        prefix = 0.0
        for r in range(rank):
            prefix += float(totals[r])
        total = 0.0
        for r in range(W):
            total += float(totals[r])
        csum = np.cumsum(np.concatenate([[prefix], ws]))[1:]
        mid = csum - 0.5 * ws
        bounds = np.cumsum(targets)[:-1] * total
        starts = comm.allreduce(np.searchsorted(mid, bounds, side="left").astype(np.int64))
        del csum, mid
    ptr = np.concatenate([[0], starts, [N]]).astype(np.int64)
    if not allow_empty and N >= int((targets > 0).sum()):
        ptr = _ensure_nonempty(ptr, targets > 0)
    sizes = np.diff(ptr)
    comm.phase = "order exchange"
    order, _ = comm.alltoallv(g, owner_counts(ptr, parts, W, bo, m))
    del g
    comm.phase = "group replies"
    perms = [lperm, rperm]  # handed over: each is freed as soon as it is spent
    del lperm, rperm
    position = reply_positions(comm, perms, bo, recv_counts, send_counts, idt)
    dest = _to_part_rows(ptr, position)
    params = {"bits": int(bits), "targets": targets.tolist(), "weighted": w is not None}
    return DistributedPartition(
        method=method, rank=rank, world=W, counts=counts, sizes=sizes, dest=dest,
        position=position, order=order, params=params,
    )  # fmt: skip


def reply_positions(comm: Comm, perms: list[np.ndarray], base: int, recv_counts: np.ndarray,
                    send_counts: np.ndarray, idt: type, prefix: str = "") -> np.ndarray:
    """Stored position of every local row (collective), after an exchange that sent the local
    rows in the order ``lperm`` (``send_counts`` per rank) and received ``recv_counts``: the
    received rows, taken in the order ``rperm``, are stored positions ``base, base + 1, ...``;
    those go back to the senders, which put them at the rows ``lperm`` names. ``perms`` is
    ``[lperm, rperm]``, handed over (no frame keeps them alive once spent); ``prefix`` starts
    the phase names."""
    rperm = perms.pop()
    m = rperm.size
    reply = np.empty(m, dtype=idt)
    for c in range(0, m, STEP):
        reply[rperm[c : c + STEP]] = np.arange(base + c, base + min(m, c + STEP), dtype=idt)
    del rperm
    trim_heap()
    comm.phase = prefix + "position exchange"
    back, _ = comm.alltoallv(reply, recv_counts, send_counts)
    del reply
    comm.phase = prefix + "positions"
    lperm = perms.pop()
    position = np.empty(lperm.size, dtype=idt)
    position[lperm] = back
    return position


def _to_part_rows(ptr: np.ndarray, gpos: np.ndarray) -> np.ndarray:
    """Part of each global stored row; turns ``gpos`` into rows within the part, in place and
    in chunks (no full-size temporaries)."""
    dest = np.empty(gpos.size, dtype=gpos.dtype)
    for c in range(0, gpos.size, STEP):
        d = np.searchsorted(ptr, gpos[c : c + STEP], side="right") - 1
        dest[c : c + STEP] = d
        gpos[c : c + STEP] -= ptr[d].astype(gpos.dtype)
    return dest


def _packed(comm, keys, idx_bits, parts, targets, counts, method, bits, allow_empty):
    """Unweighted fast path: ``code << idx_bits | row`` in one int64 (unique keys, so plain
    sorts): 8 bytes per row in the sort exchange, then 4 (int32 rows and block offsets when
    N < 2**31) in the position reply and the order exchange.

    Memory, in bytes per local row beyond the input (about as many rows arrive as leave):
    every array is freed or narrowed as soon as it is spent; the peak is ~20 (sent and
    received keys plus the int32 local rows), the result 12 (``dest``, ``position``,
    ``order`` in int32)."""
    W, rank = comm.world, comm.rank
    key = keys.pop()  # the caller's list held the only other reference
    n = key.size
    N = int(counts.sum())
    off = int(counts[:rank].sum())
    idt = index_dtype(N)
    mask = np.int64((1 << idx_bits) - 1)
    key <<= np.int64(idx_bits)
    for c in range(0, n, STEP):  # | global row, chunked: no int64 arange of all rows
        key[c : c + STEP] |= np.arange(off + c, off + min(n, c + STEP), dtype=np.int64)
    comm.phase = "local sort"
    key.sort()
    send_counts = np.diff(np.concatenate([[0], _packed_splitters(comm, key, N)]))
    trim_heap()
    comm.phase = "sort exchange"
    recv, _ = comm.alltoallv(key, send_counts)
    # local row of each sent key, in sent order (where the reply's positions belong)
    comm.phase = "merge"
    lrow = np.empty(n, dtype=idt)
    for c in range(0, n, STEP):
        np.subtract(key[c : c + STEP] & mask, off, out=lrow[c : c + STEP], casting="unsafe")
    del key
    recv.sort(kind="stable")  # sorted runs, one per source: timsort merges them in O(n log W)
    m = recv.size
    rows = np.empty(m, dtype=idt)  # global row of each position of this block, curve order
    for c in range(0, m, STEP):
        np.bitwise_and(recv[c : c + STEP], mask, out=rows[c : c + STEP], casting="unsafe")
    del recv
    trim_heap()
    comm.phase = "cut positions"
    blocks = comm.allgather(np.array([m], dtype=np.int64))[:, 0]
    block_start = np.concatenate([[0], np.cumsum(blocks)])
    ptr = np.concatenate([[0], uniform_starts(N, targets), [N]]).astype(np.int64)
    if not allow_empty and N >= int((targets > 0).sum()):
        ptr = _ensure_nonempty(ptr, targets > 0)
    # reply: this block's positions grouped by input rank (curve order inside each group),
    # as offsets into the block (the input rank adds the block's start)
    comm.phase = "group replies"
    reply, back_counts = _group_by_source(rows, np.concatenate([[0], np.cumsum(counts)]), W, idt)
    comm.phase = "position exchange"
    back, _ = comm.alltoallv(reply, back_counts, send_counts)
    del reply
    comm.phase = "order exchange"
    order, _ = comm.alltoallv(rows, owner_counts(ptr, parts, W, int(block_start[rank]), m))
    del rows
    comm.phase = "positions"
    gpos = np.empty(n, dtype=idt)  # global stored position of each local row
    sent_start = np.concatenate([[0], np.cumsum(send_counts)])
    for r in range(W):  # back piece r: offsets into block r, for the rows sent to rank r
        for c in range(int(sent_start[r]), int(sent_start[r + 1]), STEP):
            e = min(c + STEP, int(sent_start[r + 1]))
            gpos[lrow[c:e]] = back[c:e] + idt(block_start[r])
    del back, lrow
    trim_heap()
    dest = _to_part_rows(ptr, gpos)
    params = {"bits": int(bits), "targets": targets.tolist(), "weighted": False}
    return DistributedPartition(
        method=method, rank=rank, world=W, counts=counts, sizes=np.diff(ptr), dest=dest,
        position=gpos, order=order, params=params,
    )  # fmt: skip


def _group_by_source(rows: np.ndarray, starts: np.ndarray, W: int, dtype) -> tuple:
    """Positions ``0..m-1`` of ``rows`` grouped by the input rank holding each global row
    (``starts``: first global row of each rank), stable inside each group; and the group sizes.
    int16 source ranks, then per rank a chunked ``flatnonzero``: no int64 temporary of all
    rows (at 4 ranks 2x faster than a chunked counting sort, at 64 as fast)."""
    m = rows.size
    src = np.empty(m, dtype=np.int16 if W < 2**15 else np.int32)
    for c in range(0, m, STEP):
        r = np.searchsorted(starts, rows[c : c + STEP], "right")
        np.subtract(r, 1, out=src[c : c + STEP], casting="unsafe")
    sizes = np.bincount(src, minlength=W)[:W].astype(np.int64)
    out = np.empty(m, dtype=dtype)
    at = 0
    for r in range(W):
        for c in range(0, m, STEP):
            idx = np.flatnonzero(src[c : c + STEP] == r)
            out[at : at + idx.size] = idx
            out[at : at + idx.size] += c
            at += idx.size
    return out, sizes


def _packed_splitters(comm: Comm, key: np.ndarray, n_total: int) -> np.ndarray:
    """End (exclusive) in the sorted local ``key`` of the rows bound for each rank."""
    W = comm.world
    n = key.size
    s = 0
    if n:
        s = int(min(n, max(1, round(SAMPLES_PER_RANK * W * n / max(n_total, 1)))))
    pick = (np.arange(s, dtype=np.int64) * n) // max(s, 1)
    comm.phase = "splitters"
    samples = np.sort(np.concatenate(comm.allgatherv(key[pick])))
    S = samples.size
    at = (np.arange(1, W, dtype=np.int64) * S) // W
    ends = np.zeros(W, dtype=np.int64)
    ok = at > 0
    ends[:-1][ok] = np.searchsorted(key, samples[at[ok] - 1], side="right")
    ends[-1] = n
    return np.maximum.accumulate(ends)
