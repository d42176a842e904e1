"""Move each input row's fields to the rank that owns its part, in bounded buffers."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from meshshard.comm.host import Comm
from meshshard.partition.distributed._record import DistributedPartition

__all__ = ["redistribute_rows"]

DEFAULT_BUDGET = 256 << 20


def _to_numpy(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def redistribute_rows(
    arrays: dict[str, Any],
    plan: DistributedPartition,
    group: Any = None,
    *,
    budget_bytes: int = DEFAULT_BUDGET,
) -> dict[str, np.ndarray]:
    """Send every input row's fields to the rank owning its part, in stored order.

    Collective: every rank of the group that made ``plan`` must call this with the same array
    names, dtypes and trailing shapes.

    All arrays travel together, packed row by row into one byte buffer: one all_to_all per
    round. A rank whose send buffer would exceed ``budget_bytes`` splits the exchange into
    rounds (every rank runs the same number of rounds, agreed by one all_reduce), so no send
    buffer exceeds the budget (unless one row alone does).

    Parameters
    ----------
    arrays : dict of name -> array of shape (n_local, ...)
        This rank's input rows (same row order as the points given to
        :func:`partition_distributed`).
    plan : DistributedPartition
    group : ProcessGroup or 1-D DeviceMesh, optional
        The group ``plan`` was made on (default: the default group).
    budget_bytes : int
        Largest send buffer per round, in bytes.

    Returns
    -------
    dict of name -> ndarray of shape (rows owned by this rank, ...)
        Rows of the parts this rank owns, in stored order (``plan.order``).

    Raises
    ------
    ValueError
        On every rank, when some rank's arrays have the wrong row count or the ranks disagree
        on names, dtypes or trailing shapes.
    """
    comm = Comm(group, what="redistribute_rows")
    arrs = {k: _to_numpy(v) for k, v in arrays.items()}
    n = plan.dest.shape[0]
    bad = [k for k, a in arrs.items() if a.ndim == 0 or a.shape[0] != n]
    layout = [(k, a.dtype.str, a.shape[1:]) for k, a in sorted(arrs.items())]
    sig = zlib.crc32(repr(layout).encode()) & 0x7FFFFFFF
    comm.phase = "agree on arrays"
    st = comm.allgather(np.array([len(bad), sig], dtype=np.int64))
    if st[:, 0].any():
        here = f" (here: {bad} do not have {n} rows)" if bad else ""
        which = np.flatnonzero(st[:, 0]).tolist()
        msg = f"redistribute_rows: wrong row count on rank(s) {which}{here}"
        raise ValueError(msg)
    if (st[:, 1] != st[0, 1]).any():
        msg = f"redistribute_rows: ranks disagree on array names, dtypes or shapes (here: {layout})"
        raise ValueError(msg)
    names = [k for k, _, _ in layout]
    widths = [int(arrs[k].dtype.itemsize * math.prod(arrs[k].shape[1:])) for k in names]
    row_bytes = max(sum(widths), 1)
    W = comm.world
    owner = plan.owners[plan.dest]
    sperm = np.argsort(owner, kind="stable")  # by owner, then local row
    send_counts = np.bincount(owner, minlength=W).astype(np.int64)
    comm.phase = "exchange counts"
    recv_counts = comm.alltoall_counts(send_counts)
    rounds = max(1, math.ceil(n * row_bytes / max(int(budget_bytes), 1)))
    m = int(recv_counts.sum())
    bad = int(m != plan.order.shape[0])
    # one all_reduce agrees on the number of rounds and on whether every rank's plan fits
    rounds, bad = comm.allreduce(np.array([rounds, bad], dtype=np.int64), op="max").tolist()
    if bad:
        msg = (
            "redistribute_rows: the rows received do not match the plan's order on some rank "
            f"(here {m} rows, the plan says {plan.order.shape[0]}): was the plan made on "
            "another group?"
        )
        raise ValueError(msg)
    place = np.argsort(plan.order, kind="stable")  # rows arrive in global-row order
    out = {k: np.empty((m, *arrs[k].shape[1:]), dtype=arrs[k].dtype) for k in names}
    s_start = np.concatenate([[0], np.cumsum(send_counts)])
    r_start = np.concatenate([[0], np.cumsum(recv_counts)])
    for i in range(rounds):
        s_lo = (send_counts * i) // rounds
        s_hi = (send_counts * (i + 1)) // rounds
        rows = np.concatenate(
            [sperm[s_start[o] + s_lo[o] : s_start[o] + s_hi[o]] for o in range(W)]
        )
        buf = np.empty((rows.size, row_bytes), dtype=np.uint8)
        col = 0
        for k, wdt in zip(names, widths):
            part = np.ascontiguousarray(arrs[k][rows]).reshape(rows.size, wdt // arrs[k].itemsize)
            buf[:, col : col + wdt] = part.view(np.uint8)
            col += wdt
        r_lo = (recv_counts * i) // rounds
        r_hi = (recv_counts * (i + 1)) // rounds
        comm.phase = f"row exchange round {i + 1}/{rounds}"
        got, _ = comm.alltoallv(buf, s_hi - s_lo, r_hi - r_lo)
        del buf
        at = place[
            np.concatenate(
                [np.arange(r_start[s] + r_lo[s], r_start[s] + r_hi[s]) for s in range(W)]
            )
        ]
        col = 0
        for k, wdt in zip(names, widths):
            block = np.ascontiguousarray(got[:, col : col + wdt])
            out[k][at] = block.view(arrs[k].dtype).reshape(block.shape[0], *arrs[k].shape[1:])
            col += wdt
    return out
