"""The packed Hilbert / Morton sample sort in torch, on the points' device.

When the points are a CUDA tensor (or a CPU tensor with ``DEVICE_PATH``, which the tests use to
run this code on gloo), validation, bounding box, keys, sorts, splitters, the grouping of the
reply and the scatter of positions are torch ops on that device, and the exchanges pass device
tensors to ``all_to_all_single`` (NCCL exchanges them in place; gloo stages them on the host).
Only O(ranks + parts) values (counts, samples, cut positions) visit the host, plus the three
result arrays at the end (:class:`DistributedPartition` holds numpy arrays).

It follows :func:`meshshard.partition.distributed._sfc._packed` step for step, so the result
is the same (the oracle tests run both).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshshard.comm.host import Comm
from meshshard.partition.distributed._keys import torch_codes
from meshshard.partition.distributed._record import DistributedPartition, owner_counts
from meshshard.partition.distributed._sfc import ENCODE_CHUNK, SAMPLES_PER_RANK, uniform_starts
from meshshard.partition.sfc import _ensure_nonempty

__all__ = ["device_box", "device_check", "packed_device"]

#: take this path for CPU tensors too (tests: the device code on gloo)
DEVICE_PATH = False


def use_device_path(local_points: Any) -> bool:
    import torch

    return isinstance(local_points, torch.Tensor) and (
        local_points.device.type != "cpu" or DEVICE_PATH
    )


def device_check(t: Any) -> tuple[int, str]:
    """(dimension, error text or "") of a points tensor, checked on its device."""
    import torch

    if t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return -1, f"points must be a floating tensor, got {t.dtype}"
    if t.ndim != 2 or t.shape[1] not in (2, 3):
        return -1, f"points must have shape (N, 3) or (N, 2), got {tuple(t.shape)}"
    if t.shape[0] and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t).all(dim=1)).sum())
        return -1, f"points has {bad} row(s) with NaN or inf coordinates"
    return int(t.shape[1]), ""


def device_box(comm: Comm, t: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-axis float64 (min, max) over all ranks (collective), reduced on the device."""
    dim = t.shape[1]
    if t.shape[0]:
        lo = t.amin(dim=0).double().cpu().numpy()
        hi = t.amax(dim=0).double().cpu().numpy()
    else:
        lo, hi = np.full(dim, np.inf), np.full(dim, -np.inf)
    comm.phase = "bounding box"
    both = comm.allreduce(np.concatenate([lo, -hi]), op="min")
    return both[:dim], -both[dim:]


def _exchange(comm: Comm, t: Any, send: np.ndarray, recv: np.ndarray | None = None) -> Any:
    """``all_to_all_single`` of a device tensor; the result on the same device."""
    dev = t.device
    out, _ = comm.alltoallv_tensor(t, send, recv)
    return out.to(dev)


def packed_device(
    comm: Comm, t: Any, lo: np.ndarray, hi: np.ndarray, idx_bits: int, parts: int,
    targets: np.ndarray, counts: np.ndarray, method: str, bits: int, allow_empty: bool,
) -> DistributedPartition:  # fmt: skip
    """See :func:`meshshard.partition.distributed._sfc._packed` (collective)."""
    import torch

    W, rank = comm.world, comm.rank
    dev = t.device
    n = int(t.shape[0])
    N = int(counts.sum())
    off = int(counts[:rank].sum())
    idt = torch.int32 if N < 2**31 else torch.int64
    mask = (1 << idx_bits) - 1
    key = torch.empty(n, dtype=torch.int64, device=dev)
    for s in range(0, n, ENCODE_CHUNK):
        e = min(n, s + ENCODE_CHUNK)
        key[s:e] = torch_codes(t[s:e].detach(), bits, method, lo, hi)
        key[s:e] <<= idx_bits
        key[s:e] |= torch.arange(off + s, off + e, dtype=torch.int64, device=dev)
    key = torch.sort(key).values  # unique keys: any sort gives the stable order
    # splitters from regular samples (small: host)
    ns = int(min(n, max(1, round(SAMPLES_PER_RANK * W * n / max(N, 1))))) if n else 0
    pick = (torch.arange(ns, device=dev) * n) // max(ns, 1)
    comm.phase = "splitters"
    samples = np.sort(np.concatenate(comm.allgatherv(key[pick].cpu().numpy())))
    at = (np.arange(1, W, dtype=np.int64) * samples.size) // W
    ends = np.zeros(W, dtype=np.int64)
    ok = at > 0
    if ok.any():
        probe = torch.as_tensor(samples[at[ok] - 1], device=dev)
        ends[:-1][ok] = torch.searchsorted(key, probe, right=True).cpu().numpy()
    ends[-1] = n
    send_counts = np.diff(np.concatenate([[0], np.maximum.accumulate(ends)]))
    comm.phase = "sort exchange"
    recv = _exchange(comm, key, send_counts)
    lrow = ((key & mask) - off).to(idt)  # local row of each sent key, in sent order
    del key
    recv = torch.sort(recv).values
    rows = (recv & mask).to(idt)  # global row of each position of this block, curve order
    del recv
    m = int(rows.shape[0])
    comm.phase = "cut positions"
    blocks = comm.allgather(np.array([m], dtype=np.int64))[:, 0]
    block_start = np.concatenate([[0], np.cumsum(blocks)])
    ptr = np.concatenate([[0], uniform_starts(N, targets), [N]]).astype(np.int64)
    if not allow_empty and N >= int((targets > 0).sum()):
        ptr = _ensure_nonempty(ptr, targets > 0)
    # reply: block offsets grouped by input rank, curve order inside each group
    starts = torch.as_tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=idt, device=dev)
    src = torch.searchsorted(starts, rows, right=True) - 1
    back_counts = torch.bincount(src, minlength=W)[:W].cpu().numpy().astype(np.int64)
    reply = torch.sort(src, stable=True).indices.to(idt)
    del src
    comm.phase = "position exchange"
    back = _exchange(comm, reply, back_counts, send_counts)
    del reply
    comm.phase = "order exchange"
    order = _exchange(comm, rows, owner_counts(ptr, parts, W, int(block_start[rank]), m))
    del rows
    # global stored position of each local row: back piece r holds offsets into block r
    shift = torch.repeat_interleave(
        torch.as_tensor(block_start[:W], dtype=idt, device=dev),
        torch.as_tensor(send_counts, device=dev),
    )
    gpos = torch.empty(n, dtype=idt, device=dev)
    gpos[lrow.long()] = back + shift
    del back, shift, lrow
    ptr_t = torch.as_tensor(ptr, dtype=idt, device=dev)
    dest = torch.searchsorted(ptr_t, gpos, right=True) - 1
    gpos -= ptr_t[dest]
    params = {"bits": int(bits), "targets": targets.tolist(), "weighted": False}
    return DistributedPartition(
        method=method, rank=rank, world=W, counts=counts, sizes=np.diff(ptr),
        dest=dest.to(idt).cpu().numpy(), position=gpos.cpu().numpy(),
        order=order.cpu().numpy(), params=params,
    )  # fmt: skip
