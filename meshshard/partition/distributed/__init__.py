"""Distributed partitioning: no rank ever holds the whole sample.

The one corner of :mod:`meshshard.partition` that uses ``torch.distributed``. Every public
function here is a collective: every rank of the group must call it.

- :func:`partition_distributed`: each rank passes the rows it holds (e.g. a row range of a
  file); each gets back a :class:`DistributedPartition` (its rows' parts and stored positions,
  the global sizes, and the ``order`` piece of the parts it owns). The result equals
  :func:`meshshard.partition.partition` on the rows concatenated in rank order.
- :func:`redistribute_rows`: move row fields to the rank owning their part (bounded buffers).
- :func:`halo_plan_radius_distributed`: this rank's piece of the exact radius halo plan,
  from part bounding boxes, with no global gather; :func:`halo_plan_graph_distributed`: the
  k-ring halo along a graph whose rows are spread like the points.

Tie rule (the oracle): points are ordered by ``(key, global row)``, where the global row is
the position in the rank-ordered concatenation. Hilbert/Morton codes equal ties by row, as the
single-process stable curve sort does; RCB puts the ``k`` smallest ``(coordinate, row)`` on
the left, as :func:`meshshard.partition.rcb.rcb` does.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

import numpy as np

from meshshard.comm.host import Comm, ExchangeError
from meshshard.partition._validation import as_points, check_parts, check_targets, check_weights
from meshshard.partition.distributed import _sfc_device, halo
from meshshard.partition.distributed._rcb import rcb_partition
from meshshard.partition.distributed._record import DistributedPartition, part_owners
from meshshard.partition.distributed._sfc import PACK_BITS, global_box, sfc_partition
from meshshard.partition.distributed._sfc_device import device_check
from meshshard.partition.distributed.redistribute import redistribute_rows
from meshshard.partition.sfc import _check_bits, default_bits

__all__ = [
    "DistributedPartition",
    "ExchangeError",
    "halo_plan_graph_distributed",
    "halo_plan_radius_distributed",
    "partition_distributed",
    "part_owners",
    "redistribute_rows",
]

METHODS = ("hilbert", "morton", "rcb")

# Test hook: {"phase": name, "rank": r} makes rank r raise when it reaches that phase (the
# bad-input tests use it to stop one rank mid-exchange; the communication itself is real).
_FAULT: dict = {}


def _fault(comm: Comm, phase: str) -> None:
    if _FAULT.get("phase") == phase and _FAULT.get("rank") == comm.rank:
        msg = f"injected fault on rank {comm.rank} at phase {phase!r}"
        raise RuntimeError(msg)


def _crc(*parts: Any) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def _agree(
    comm: Comm, local_points: Any, weights: Any, parts: Any, method: str, extra: Any,
    on_device: bool = False,
):  # fmt: skip
    """Validate this rank's input and agree with every rank on validity, dims, dtype,
    weights, parts and method in one all_gather (collective). Raises the same error on every
    rank. ``on_device``: a tensor checked where it lives (``pts`` comes back None)."""
    err, text = 0, ""
    pts = w = None
    dim = -1
    dtype_crc = 0
    n = -1
    try:
        dtype_crc = _crc(str(getattr(local_points, "dtype", type(local_points))))
        if on_device:
            dim, text = device_check(local_points)
            if text:
                raise ValueError(text)
            n = int(local_points.shape[0])
        else:
            pts = as_points(local_points, keep_float=True)
            dim, n = pts.shape[1], pts.shape[0]
        w = check_weights(weights, n)
    except (TypeError, ValueError) as exc:
        err, text = 1, str(exc)
    status = np.array(
        [err, dim, dtype_crc, n, weights is not None, _crc(parts, method, extra)],
        dtype=np.int64,
    )  # fmt: skip
    comm.phase = "agree on input"
    allst = comm.allgather(status)
    bad = np.flatnonzero(allst[:, 0]).tolist()
    if bad:
        mine = f" (here: {text})" if text else ""
        msg = f"partition_distributed: invalid input on rank(s) {bad}{mine}; every rank stops"
        raise ValueError(msg)
    for col, what in ((1, "point dimension"), (2, "points dtype"), (4, "passing weights"),
                      (5, "parts / method / targets / bits")):  # fmt: skip
        vals = allst[:, col]
        if (vals != vals[0]).any():
            if col == 1:
                shown = {r: int(v) for r, v in enumerate(vals)}
            elif col == 2:
                shown = "; pass the same dtype (e.g. float32) on every rank"
            else:
                shown = ""
            msg = f"partition_distributed: ranks disagree on {what}: {shown}"
            raise ValueError(msg)
    return pts, w, allst[:, 3].astype(np.int64)


def _stats(out: DistributedPartition, comm: Comm) -> DistributedPartition:
    comm.phase = "done"
    return replace(
        out,
        exchange_bytes=dict(comm.bytes),
        peak_buffer=comm.peak_buffer,
        exchange_seconds=dict(comm.seconds),
        phase_seconds=dict(comm.phase_seconds),
    )


def partition_distributed(
    local_points: Any,
    parts: int,
    group: Any = None,
    method: str = "hilbert",
    *,
    weights: Any = None,
    targets: Any = None,
    allow_empty: bool = False,
    bits: int | None = None,
) -> DistributedPartition:
    """Partition points spread over ranks; equals :func:`partition` on their concatenation.

    Collective: every rank of ``group`` must call this, each with the rows it holds (any
    number, zero included). Memory per rank is O(local rows + the rows it ends up owning).

    Parameters
    ----------
    local_points : array (numpy or torch, CPU or CUDA) of shape (n_local, 3) or (n_local, 2)
        This rank's rows; global row ``i`` of rank ``r`` is ``sum(n_local of ranks < r) + i``.
        Every rank must pass the same dtype and dimension.
    parts : int
        Number of parts P (any P >= 1; part ``p`` is owned by rank ``p * world // P``).
    group : ProcessGroup or 1-D DeviceMesh, optional
        Default: the default process group.
    method : {"hilbert", "morton", "rcb"}
    weights : array of shape (n_local,), optional
        Per-point work of this rank's rows.
    targets : array of shape (P,), optional
        Fraction of the total weight per part (same on every rank).
    allow_empty : bool
        Allow empty parts when N < P.
    bits : int, optional
        SFC grid resolution (default from the global N, as in :func:`hilbert`).

    Returns
    -------
    DistributedPartition

    Raises
    ------
    ValueError, TypeError
        On every rank, when any rank's input is invalid (NaN, bad shape) or ranks disagree on
        dimension, dtype, weights, parts, method or targets.
    ExchangeError
        A collective failed because another rank raised, died or timed out (the group's
        timeout bounds the wait).

    Notes
    -----
    Equality with the single-process result is exact for unweighted inputs. With weights,
    prefix sums are formed per rank and then combined, so a cut can differ from the
    single-process one only when a weight midpoint lies within float64 rounding of a cut
    bound; weights whose partial sums are exact in float64 (integers, dyadic fractions) give
    identical cuts.
    """
    import torch

    device = None
    if isinstance(local_points, torch.Tensor) and local_points.device.type != "cpu":
        device = local_points.device
    comm = Comm(group, device=device, what="partition_distributed")
    if method not in METHODS:
        msg = f"unknown method {method!r} for partition_distributed; choose one of {METHODS}"
        raise ValueError(msg)
    t_crc = None if targets is None else np.asarray(
        targets.detach().cpu() if isinstance(targets, torch.Tensor) else targets, dtype=float
    ).tobytes()  # fmt: skip
    # unweighted Hilbert / Morton of a device tensor: validation, box, keys, sorts and
    # exchanges stay on the device (see _sfc_device); RCB and weights take the host path
    on_device = method != "rcb" and weights is None and _sfc_device.use_device_path(local_points)
    pts, w, counts = _agree(comm, local_points, weights, parts, method, (t_crc, bits), on_device)
    n_total = int(counts.sum())
    parts = check_parts(parts, n_total, allow_empty=allow_empty)
    t = check_targets(targets, parts)
    if on_device:
        dim = int(local_points.shape[1])
        bits = default_bits(n_total, dim) if bits is None else _check_bits(bits, dim)
        idx_bits = max((n_total - 1).bit_length(), 1)
        if bits * dim + idx_bits <= PACK_BITS:
            lo, hi = _sfc_device.device_box(comm, local_points)
            _fault(comm, "exchange")
            out = _sfc_device.packed_device(
                comm, local_points, lo, hi, idx_bits, parts, t, counts, method, bits,
                allow_empty,
            )  # fmt: skip
            return _stats(out, comm)
        pts = as_points(local_points, keep_float=True)  # too many bits to pack: host path
    lo, hi = global_box(comm, pts)
    tensor = local_points if isinstance(local_points, torch.Tensor) else None  # keys on its device
    _fault(comm, "exchange")
    if method == "rcb":
        out = rcb_partition(
            comm, pts, w, parts, t, counts, allow_empty=allow_empty, lo=lo, hi=hi, tensor=tensor
        )
        return _stats(out, comm)
    dim = pts.shape[1]
    bits = default_bits(n_total, dim) if bits is None else _check_bits(bits, dim)
    out = sfc_partition(
        comm, pts, w, parts, t, counts, method=method, bits=bits,
        allow_empty=allow_empty, lo=lo, hi=hi, tensor=tensor,
    )  # fmt: skip
    return _stats(out, comm)


def __getattr__(name: str) -> Any:
    if name == "redistribute_rows":
        return redistribute_rows
    if name in ("halo_plan_radius_distributed", "halo_plan_graph_distributed"):
        return getattr(halo, name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
