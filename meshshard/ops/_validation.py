"""Input checks for the distributed ops, in one place.

Checks that depend on data held by one rank (shapes, NaN/inf counts, dtypes, scalar arguments)
are made *collectively*: every rank contributes one small row of numbers to a single
``all_gather`` and then every rank evaluates the same conditions on the same table, so a bad
input on one rank raises the same error on all ranks instead of leaving the others hanging in
the next collective. The same gather yields every rank's row count (the sharding sizes).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from meshshard.comm.resident import device_ints
from meshshard.comm.rows import all_gather_rows, collective_flag

__all__ = ["PointsMeta", "check_points", "check_reduce", "collective_flag"]

_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_NCOL = 17
#: coordinates whose bounds travel with the facts (the cell list indexes at most 4)
_BDIM = 4


@dataclass(frozen=True)
class PointsMeta:
    """What :func:`check_points` learned: per-rank row counts, the coordinate dim and every
    rank's bounding box of ``x`` and of the queries (host floats, first 4 coordinates;
    ``inf`` / ``-inf`` for an empty shard)."""

    x_sizes: tuple[int, ...]
    y_sizes: tuple[int, ...]
    dim: int
    x_bounds: tuple = ()
    y_bounds: tuple = ()

    @property
    def x_offsets(self) -> list[int]:
        out = [0]
        for s in self.x_sizes:
            out.append(out[-1] + s)
        return out


def _kind(t: torch.Tensor) -> int:
    if t.is_complex():
        return 2
    if not t.is_floating_point():
        return 1
    return 0


def _row(t: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Host facts of ``t`` and its count of non-finite values (a device scalar: no read-back)."""
    ndim = t.dim()
    rows = int(t.shape[0]) if ndim >= 1 else -1
    dim = int(t.shape[-1]) if ndim >= 1 else -1
    kind = _kind(t)
    nonfinite = torch.zeros((), dtype=torch.int64, device=t.device)
    if kind == 0 and t.numel():
        flat = t.detach().reshape(t.shape[0], -1) if ndim >= 1 else t.detach().reshape(1, 1)
        step = 1 << 20  # rows at a time: no full-size temporaries on large shards
        for s in range(0, flat.shape[0], step):
            nonfinite = nonfinite + (~torch.isfinite(flat[s : s + step])).sum()
    code = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1
    return [ndim, rows, dim, kind, code], nonfinite


def _bounds(t: torch.Tensor, device) -> torch.Tensor:
    """(2, _BDIM) float64 box of the rows of ``t`` in its first coordinates (``inf`` /
    ``-inf`` when empty or not points; zero-padded past ``d``): the same size on every rank
    whatever the shapes, so the facts gather cannot mismatch."""
    out = torch.stack([torch.full((_BDIM,), float("inf"), dtype=torch.float64, device=device),
                       torch.full((_BDIM,), float("-inf"), dtype=torch.float64, device=device)])
    if t.dim() != 2 or not t.shape[0] or not t.is_floating_point() or t.device != device:
        return out
    d = min(t.shape[1], _BDIM)
    td = t.detach()[:, :d]
    lo = torch.nn.functional.pad(td.amin(0).double(), [0, _BDIM - d])
    hi = torch.nn.functional.pad(td.amax(0).double(), [0, _BDIM - d])
    ok = torch.isfinite(lo) & torch.isfinite(hi)  # NaN rows raise anyway; keep the box finite
    return torch.stack([torch.where(ok, lo, out[0]), torch.where(ok, hi, out[1])])


def _float_bits(v: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(v)))[0]


def _bits_float(b: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(b)))[0]


def _ranks(col: np.ndarray) -> str:
    return ", ".join(str(i) for i in np.nonzero(col)[0].tolist())


def check_points(
    x: torch.Tensor,
    y: torch.Tensor | None,
    *,
    group: dist.ProcessGroup | None,
    op: str,
    k: int | None = None,
    r: float | None = None,
    loop: bool = True,
    x_sizes: Sequence[int] | None = None,
) -> PointsMeta:
    """Validate point tensors on every rank at once and return the sharding sizes.

    Collective: every rank of ``group`` must call this; all ranks raise the same error.
    One ``all_gather`` and one host read-back (the table of facts), which also brings every
    rank's bounding boxes: the checks cost no host sync of their own.

    Parameters
    ----------
    x : Tensor of shape (n_local, d)
        This rank's points.
    y : Tensor of shape (m_local, d) or None
        This rank's queries (``None``: the queries are ``x``).
    op : str
        Name used in messages (``"knn"``, ``"radius"``).
    k, r : optional
        Neighbour count / radius to check (must be equal on every rank).
    loop : bool
        With ``y=None`` and ``loop=False`` a point is not its own neighbour, so ``k <= N - 1``.
    x_sizes : sequence of int, optional
        Sizes the caller believes; checked against the real ones.

    Raises
    ------
    ValueError, TypeError
        With what was found (and on which ranks) and how to fix it.
    """
    for name, t in (("x", x), ("y", y)):
        if t is not None and not isinstance(t, torch.Tensor):
            msg = f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}"
            raise TypeError(msg)
    if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
        msg = f"{op}: k must be an int, got {type(k).__name__} ({k!r})"
        raise TypeError(msg)
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float))):
        msg = f"{op}: r must be a number, got {type(r).__name__} ({r!r})"
        raise TypeError(msg)
    device = x.device
    hx, nfx = _row(x)
    if y is not None:
        hy, nfy = _row(y)
    else:
        hy, nfy = [-9] * 5, torch.zeros((), dtype=torch.int64, device=device)
    host = hx + hy + [
        -1 if k is None else int(k),
        0 if r is None else _float_bits(r),
        int(y is not None and (y.device != x.device)),
        int(y is not None),
        int(x.requires_grad) + 2 * int(y is not None and y.requires_grad),
    ]
    assert len(host) == _NCOL - 2
    box = torch.cat([_bounds(x, device).reshape(-1),
                     _bounds(y if y is not None else x, device).reshape(-1)])
    parts = [device_ints(host, device), nfx.reshape(1), nfy.reshape(1).to(device),
             box.view(torch.int64)]
    table = np.asarray(all_gather_rows(torch.cat(parts), group).tolist(), dtype=np.int64)
    t = table[:, :_NCOL]
    # the facts in the checks' column order: x (ndim, rows, dim, kind, non-finite, dtype),
    # y (the same), k, r, device mismatch, has y, requires_grad
    t = np.concatenate([t[:, 0:4], t[:, 15:16], t[:, 4:5], t[:, 5:9], t[:, 16:17], t[:, 9:10],
                        t[:, 10:15]], axis=1)
    _raise_from_table(t, op=op, k=k, r=r, loop=loop)
    xs = tuple(int(v) for v in t[:, 1].tolist())
    ys = tuple(int(v) for v in t[:, 7].tolist()) if y is not None else xs
    if x_sizes is not None and tuple(int(s) for s in x_sizes) != xs:
        msg = (
            f"{op}: x_sizes={list(x_sizes)} disagree with the rows the ranks hold ({list(xs)}); "
            "pass the sharding sizes of x or None to infer them"
        )
        raise ValueError(msg)
    d = min(int(t[0, 2]), _BDIM)
    fb = table[:, _NCOL:].copy().view(np.float64).reshape(-1, 2, 2, _BDIM)[..., :d]
    xb = tuple((tuple(b[0, 0].tolist()), tuple(b[0, 1].tolist())) for b in fb)
    yb = tuple((tuple(b[1, 0].tolist()), tuple(b[1, 1].tolist())) for b in fb)
    return PointsMeta(xs, ys, int(t[0, 2]), xb, yb)


def _raise_from_table(t: np.ndarray, *, op: str, k, r, loop: bool) -> None:
    has_y = bool(t[0, 15])
    for name, c in (("x", 0), ("y", 6)) if has_y else (("x", 0),):
        ndim = t[:, c]
        if (ndim != 2).any():
            bad = np.nonzero(ndim != 2)[0].tolist()
            msg = (
                f"{op}: {name} must have shape (n, d) on every rank; rank(s) {bad} hold "
                f"{[int(ndim[b]) for b in bad]}-D tensors. Reshape to (n, d), "
                f"e.g. {name}.reshape(-1, d)"
            )
            raise ValueError(msg)
        kind = t[:, c + 3]
        if (kind != 0).any():
            what = "complex" if (kind == 2).any() else "integer/bool"
            msg = (
                f"{op}: {name} has {what} coordinates on rank(s) {_ranks(kind != 0)}; "
                f"distances need floating point: pass {name}.float() (or .double())"
            )
            raise TypeError(msg)
        if (t[:, c + 5] < 0).any():
            msg = f"{op}: {name} has an unsupported dtype on rank(s) {_ranks(t[:, c + 5] < 0)}"
            raise TypeError(msg)
        if (t[:, c + 5] != t[0, c + 5]).any():
            codes = sorted({_DTYPES[int(v)] for v in t[:, c + 5]}, key=str)
            msg = f"{op}: {name} has different dtypes across ranks ({codes}); cast to one dtype"
            raise TypeError(msg)
        dims = t[:, c + 2]
        if (dims != dims[0]).any():
            msg = (
                f"{op}: {name} has different feature dims across ranks ({dims.tolist()}); "
                "every rank must hold points of the same dimension"
            )
            raise ValueError(msg)
        nonfinite = t[:, c + 4]
        if nonfinite.sum() > 0:
            per = {i: int(v) for i, v in enumerate(nonfinite.tolist()) if v}
            msg = (
                f"{op}: {name} holds {int(nonfinite.sum())} NaN/inf coordinate value(s) "
                f"(per rank: {per}); remove or repair those points before the query"
            )
            raise ValueError(msg)
    if has_y:
        if t[0, 2] != t[0, 8]:
            msg = (
                f"{op}: x has {int(t[0, 2])} coordinates per point but y has {int(t[0, 8])}; "
                "queries and points must live in the same space"
            )
            raise ValueError(msg)
        if t[0, 5] != t[0, 11]:
            msg = (
                f"{op}: x is {_DTYPES[int(t[0, 5])]} but y is {_DTYPES[int(t[0, 11])]}; "
                "cast both to one dtype"
            )
            raise TypeError(msg)
        if t[:, 14].any():
            msg = f"{op}: x and y are on different devices on rank(s) {_ranks(t[:, 14])}"
            raise ValueError(msg)
    if (t[:, 12] != t[0, 12]).any() or (t[:, 13] != t[0, 13]).any():
        msg = (
            f"{op}: the scalar arguments (k / r) differ across ranks "
            f"(k: {t[:, 12].tolist()}, r: {[_bits_float(b) for b in t[:, 13].tolist()]}); "
            "pass the same value on every rank"
        )
        raise ValueError(msg)
    grads = t[:, 16]
    if (grads != grads[0]).any():
        msg = (
            f"{op}: requires_grad of x / y differs across ranks (per rank, 1 = x, 2 = y, "
            f"3 = both: {grads.tolist()}); the backward is collective, so set requires_grad "
            "the same way on every rank"
        )
        raise ValueError(msg)
    n_total = int(t[:, 1].sum())
    if k is not None:
        if k < 1:
            msg = f"{op}: k={k} must be >= 1"
            raise ValueError(msg)
        limit = n_total if (loop or has_y) else n_total - 1
        if k > limit:
            extra = "" if (loop or has_y) else " minus the point itself (loop=False)"
            msg = (
                f"{op}: k={k} is larger than the {limit} point(s) available over all ranks"
                f"{extra}; use k <= {limit}"
            )
            raise ValueError(msg)
    if r is not None:
        if math.isnan(r) or r <= 0 or math.isinf(r):
            msg = f"{op}: r={r} must be a finite number > 0"
            raise ValueError(msg)


def check_reduce(reduce: str) -> None:
    if reduce not in ("sum", "mean", "max"):
        msg = f"reduce={reduce!r} must be one of 'sum', 'mean', 'max'"
        raise ValueError(msg)
