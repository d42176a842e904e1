"""Distributed recursive coordinate bisection; the points never move until the end.

Level by level, for all tree nodes of the level at once: global row counts and bounding boxes
(all_reduce), the cut axis and the count ``k`` going left exactly as
:func:`meshshard.partition.rcb.rcb` computes them, then the k-th smallest key ``(coord, global
row)`` by distributed selection (:mod:`._select`; weighted cuts first find ``k`` from the
weight midpoints). Every rank then splits its own rows of the node by that key. At the end the
rows go to the rank owning their part in one all_to_all, sorted there by Hilbert code (the
single-process stored order), and each input rank learns its rows' stored positions in one
more all_to_all.
"""

from __future__ import annotations

import numpy as np

from meshshard.comm.host import Comm
from meshshard.partition.distributed._mem import index_dtype, trim_heap
from meshshard.partition.distributed._record import DistributedPartition, part_owners
from meshshard.partition.distributed._select import select
from meshshard.partition.distributed._sfc import encode, reply_positions
from meshshard.partition.sfc import default_bits

__all__ = ["rcb_partition"]

#: keys pack into one int64 when they need at most this many bits (tests lower it to run the
#: general path that very large inputs take)
PACK_BITS = 63
_STEP = 1 << 18  # rows per step of chunked passes


def rcb_partition(
    comm: Comm,
    pts: np.ndarray,
    w: np.ndarray | None,
    parts: int,
    targets: np.ndarray,
    counts: np.ndarray,
    *,
    allow_empty: bool,
    lo: np.ndarray,
    hi: np.ndarray,
    tensor=None,
) -> DistributedPartition:
    """See :func:`meshshard.partition.distributed.partition_distributed` (collective)."""
    rank = comm.rank
    n, dim = pts.shape
    N = int(counts.sum())
    off = int(counts[:rank].sum())
    t = targets
    want = (t > 0).astype(np.int64)
    strict = not allow_empty and N >= int(want.sum())
    idt = index_dtype(N)  # int32 rows and parts unless N >= 2**31
    lp = np.arange(n, dtype=idt)  # local rows grouped by node
    dest = np.empty(n, dtype=idt)
    nodes = [(0, n, 0, parts)]  # (local start, local stop, first part, part stop)
    while nodes:
        for s, e, a, b in nodes:
            if b - a == 1:
                dest[lp[s:e]] = a
        active = [nd for nd in nodes if nd[3] - nd[2] > 1]
        if not active:
            break
        J = len(active)
        comm.phase = "rcb boxes"
        cnt = np.zeros(J, dtype=np.int64)
        box = np.empty((J, 2 * dim))
        wsum = np.zeros(J)
        for j, (s, e, _a, _b) in enumerate(active):
            cnt[j] = e - s
            if e > s:
                idx = lp[s:e]
                for a_ in range(dim):  # column by column: (n, 3) axis-0 reductions are slow
                    col = pts[idx, a_]
                    box[j, a_], box[j, dim + a_] = col.min(), -col.max()
                del col
                if w is not None:
                    wsum[j] = w[lp[s:e]].sum()
            else:
                box[j] = np.inf
        cnt = comm.allreduce(cnt)
        box = comm.allreduce(box, op="min")
        if w is not None:
            wsum = comm.allreduce(wsum)
        axes, cands, reqs, ks = [], [], [], []
        for j, (s, e, a, b) in enumerate(active):
            nn = int(cnt[j])
            m = a + (b - a) // 2
            tl, tr = float(t[a:m].sum()), float(t[m:b].sum())
            frac = tl / (tl + tr) if tl + tr > 0 else 0.5
            axis = int(np.argmax(-box[j, dim:] - box[j, :dim])) if nn else 0
            axes.append(axis)
            idx = lp[s:e]
            # float64 coordinates (what select compares) and global rows in the index dtype
            cands.append((pts[idx, axis].astype(np.float64), idx + idt(off),
                          None if w is None else w[idx]))  # fmt: skip
            lo_min = int(want[a:m].sum()) if strict else 0
            hi_min = int(want[m:b].sum()) if strict else 0
            if nn == 0:
                ks.append((0, lo_min, hi_min))
                reqs.append(None)
            elif w is None:
                k = int(np.floor(frac * nn + 0.5))
                ks.append((min(max(k, lo_min), nn - hi_min), lo_min, hi_min))
                reqs.append(None)
            else:
                ks.append((None, lo_min, hi_min))
                reqs.append(("weight", frac * float(wsum[j])))
        if w is not None:
            found = select(comm, cands, reqs)
            for j in range(J):
                if ks[j][0] is None:
                    k, lo_min, hi_min = int(found[j]), ks[j][1], ks[j][2]
                    ks[j] = (min(max(k, lo_min), int(cnt[j]) - hi_min), lo_min, hi_min)
        reqs = [("count", k) if 0 < k < int(cnt[j]) else None for j, (k, _, _) in enumerate(ks)]
        keys = select(comm, cands, reqs)
        nxt = []
        for j, (s, e, a, b) in enumerate(active):
            m = a + (b - a) // 2
            k = ks[j][0]
            idx = lp[s:e]
            if keys[j] is None:
                nleft = idx.size if k == int(cnt[j]) else 0
            else:
                kc, kg = keys[j]
                c = cands[j][0]
                left = (c < kc) | ((c == kc) & (idx + off <= kg))
                nleft = int(np.count_nonzero(left))
                lp[s:e] = np.concatenate([idx[left], idx[~left]])
            nxt.append((s, s + nleft, a, m))
            nxt.append((s + nleft, e, m, b))
        del cands
        nodes = nxt
    del lp
    args = [dest]  # handed over: no frame here keeps dest's temporaries alive
    del dest
    return _to_owners(comm, pts, args, parts, counts, lo, hi, targets, w is not None, tensor)


def _to_owners(
    comm, pts, args, parts, counts, lo, hi, targets, weighted, tensor=None
) -> DistributedPartition:
    """Send (part, Hilbert code) keys and rows to the part owners, sort there, reply
    positions. Keys travel as int64 (``(part, code)`` packed, or both columns), rows and
    positions in the index dtype; arrays are freed as soon as they are spent."""
    W, rank = comm.world, comm.rank
    dest = args.pop()
    n, dim = pts.shape
    N = int(counts.sum())
    off = int(counts[:rank].sum())
    idt = index_dtype(N)
    comm.phase = "rcb sizes"
    sizes = comm.allreduce(np.bincount(dest, minlength=parts).astype(np.int64))
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    bits = default_bits(N, dim)
    comm.phase = "rcb encode and sort"
    key = encode(pts, bits, "hilbert", lo, hi, tensor)
    cb = bits * dim
    packed = parts.bit_length() + cb <= PACK_BITS
    owners = part_owners(parts, W)
    send_counts = np.bincount(owners[dest], minlength=W).astype(np.int64)
    if packed:  # (part, code) in one int64; stable sorts keep equal keys in row order
        for c in range(0, n, _STEP):
            key[c : c + _STEP] |= dest[c : c + _STEP].astype(np.int64) << np.int64(cb)
        sperm = np.argsort(key, kind="stable").astype(idt)
        skey = key[sperm]
        del key
    else:
        sperm = np.lexsort((key, dest)).astype(idt)  # by part, then code, then row
        skey = np.empty((n, 2), dtype=np.int64)
        skey[:, 0] = dest[sperm]
        np.take(key, sperm, out=skey[:, 1])
        del key
    trim_heap()
    comm.phase = "rcb owner exchange"
    recv, recv_counts = comm.alltoallv(skey, send_counts)
    del skey
    srow = sperm + idt(off)  # global rows, in sent order
    rows, _ = comm.alltoallv(srow, send_counts, recv_counts)
    del srow
    comm.phase = "rcb owner sort"
    if packed:  # sources arrive in row order
        rperm = np.argsort(recv, kind="stable")
    else:
        rperm = np.lexsort((recv[:, 1], recv[:, 0]))
    del recv
    order = rows[rperm]
    del rows
    first = int(np.searchsorted(owners, rank))
    base = int(ptr[min(first, parts)])
    perms = [sperm, rperm]  # handed over: each is freed as soon as it is spent
    del sperm, rperm
    position = reply_positions(comm, perms, base, recv_counts, send_counts, idt, "rcb ")
    for c in range(0, n, _STEP):  # chunked: no int64 temporary of all rows
        position[c : c + _STEP] -= ptr[dest[c : c + _STEP]].astype(idt)
    params = {"targets": np.asarray(targets).tolist(), "weighted": bool(weighted)}
    return DistributedPartition(
        method="rcb", rank=rank, world=W, counts=counts, sizes=sizes, dest=dest,
        position=position, order=order, params=params,
    )  # fmt: skip
