"""Space-filling-curve partitioners: Morton (Z-order) and Hilbert, 2-D and 3-D.

Points are quantised on an isotropic grid over their bounding box (``bits`` per axis), encoded
with vectorised bit tricks (loops only over bit levels, never over points), sorted along the
curve, and the curve is cut into pieces by cumulative weight against the target fractions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshshard.partition._validation import (
    as_points,
    check_parts,
    check_targets,
    check_weights,
)
from meshshard.partition.record import Partition, shard_labels

__all__ = [
    "curve_order",
    "group_by_shard",
    "hilbert",
    "hilbert_codes",
    "morton",
    "morton_codes",
    "split_curve",
]

_MAX_BITS = {2: 31, 3: 21}


def default_bits(n: int, dim: int) -> int:
    """Grid resolution per axis: about 16 cells per point on average, capped by 64-bit codes."""
    need = int(np.ceil(np.log2(max(n, 2)) / dim)) + 3
    return int(min(max(need, 4), _MAX_BITS[dim]))


def bounding_box(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-axis (min, max) of ``points`` as float64 (column-wise reductions: on big inputs
    (N, 3) reductions along axis 0 are several times slower)."""
    lo = np.array([points[:, i].min() for i in range(points.shape[1])], dtype=np.float64)
    hi = np.array([points[:, i].max() for i in range(points.shape[1])], dtype=np.float64)
    return lo, hi


def _quantise(
    points: np.ndarray, bits: int, bounds: tuple[np.ndarray, np.ndarray] | None = None
) -> np.ndarray:
    """Integer grid coordinates in ``[0, 2**bits)`` on the bounding cube (aspect preserved).

    ``bounds`` (float64 per-axis min and max) defaults to the box of ``points``; the
    distributed partitioner passes the global box so every rank quantises as one process
    holding all points would."""
    if points.shape[0] == 0:
        return np.zeros(points.shape, dtype=np.uint32)
    # Chunked arithmetic: large float temporaries are several times slower on big inputs.
    # float64 bounds: float32 points then quantise exactly as their float64 copy would
    lo, hi = bounding_box(points) if bounds is None else bounds
    extent = float((hi - lo).max())
    cells = (1 << bits) - 1
    q = np.zeros(points.shape, dtype=np.uint32)
    if extent == 0.0:
        return q
    scale = cells / extent
    chunk = 1 << 16
    buf = np.empty((min(chunk, points.shape[0]), points.shape[1]))
    for s in range(0, points.shape[0], chunk):
        e = min(s + chunk, points.shape[0])
        b = buf[: e - s]
        np.subtract(points[s:e], lo, out=b)
        # (p - lo) * scale lies in [0, cells] up to rounding; truncation keeps it there.
        np.multiply(b, scale, out=q[s:e], casting="unsafe")
    return q


def _spread(v: np.ndarray, dim: int) -> np.ndarray:
    """Insert ``dim - 1`` zero bits between the bits of ``v`` (magic-number bit spreading)."""
    x = v.astype(np.uint64)
    if dim == 3:  # 21 bits -> 63
        x &= np.uint64(0x1FFFFF)
        x = (x | (x << np.uint64(32))) & np.uint64(0x1F00000000FFFF)
        x = (x | (x << np.uint64(16))) & np.uint64(0x1F0000FF0000FF)
        x = (x | (x << np.uint64(8))) & np.uint64(0x100F00F00F00F00F)
        x = (x | (x << np.uint64(4))) & np.uint64(0x10C30C30C30C30C3)
        x = (x | (x << np.uint64(2))) & np.uint64(0x1249249249249249)
    else:  # 32 bits -> 64
        x &= np.uint64(0xFFFFFFFF)
        x = (x | (x << np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
        x = (x | (x << np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
        x = (x | (x << np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
        x = (x | (x << np.uint64(2))) & np.uint64(0x3333333333333333)
        x = (x | (x << np.uint64(1))) & np.uint64(0x5555555555555555)
    return x


def _interleave(q: np.ndarray) -> np.ndarray:
    """Interleave the bits of the columns of ``q`` (column 0 most significant)."""
    dim = q.shape[1]
    code = np.zeros(q.shape[0], dtype=np.uint64)
    for axis in range(dim):
        code |= _spread(q[:, axis], dim) << np.uint64(dim - 1 - axis)
    return code


def morton_codes(points: Any, bits: int | None = None) -> np.ndarray:
    """Morton (Z-order) code of every point.

    Parameters
    ----------
    points : array of shape (N, 3) or (N, 2)
    bits : int, optional
        Grid resolution per axis (default: from N; at most 21 in 3-D, 31 in 2-D).

    Returns
    -------
    ndarray of shape (N,), uint64
    """
    return _codes(points, bits, _ENCODERS["morton"])


def hilbert_codes(points: Any, bits: int | None = None) -> np.ndarray:
    """Hilbert code of every point (Skilling's transpose algorithm, vectorised over points).

    Same parameters and return type as :func:`morton_codes`; consecutive codes are
    face-adjacent grid cells.
    """
    return _codes(points, bits, _ENCODERS["hilbert"])


def _codes(points: Any, bits: int | None, encode) -> np.ndarray:
    pts = as_points(points, keep_float=True)
    dim = pts.shape[1]
    bits = default_bits(pts.shape[0], dim) if bits is None else _check_bits(bits, dim)
    return _encode(pts, bits, encode)


def _encode(pts: np.ndarray, bits: int, encode, bounds=None) -> np.ndarray:
    """Quantise validated ``pts`` and ``encode(q, bits)`` them in cache-sized chunks (the ~30
    passes per bit level of the Hilbert transform, or the bit spreading, then run in cache).
    ``bounds``: see :func:`_quantise`."""
    q = _quantise(pts, bits, bounds)
    codes = np.empty(q.shape[0], dtype=np.uint64)
    chunk = 1 << 15
    for s in range(0, q.shape[0], chunk):
        codes[s : s + chunk] = encode(q[s : s + chunk], bits)
    return codes


def _hilbert_transpose(q: np.ndarray, bits: int) -> np.ndarray:
    """Skilling's axes-to-transpose on grid coordinates ``q`` (n, dim) uint32."""
    dim = q.shape[1]
    x = [np.ascontiguousarray(c) for c in q.T]  # one uint32 array per axis
    # Inverse undo (J. Skilling, "Programming the Hilbert curve", AIP Conf. Proc. 707, 2004),
    # branch-free: ``hit`` is P where bit ``level`` of x[i] is set (invert the low bits of
    # x[0]); elsewhere the low bits of x[0] and x[i] are exchanged.
    zero = np.uint32(0)
    hit = np.empty_like(x[0])
    t = np.empty_like(x[0])
    for level in range(bits - 1, 0, -1):
        p = np.uint32((1 << level) - 1)
        for i in range(dim):
            np.right_shift(x[i], np.uint32(level), out=hit)
            hit &= np.uint32(1)
            np.subtract(zero, hit, out=hit)  # 0xFFFFFFFF where set
            hit &= p
            if i == 0:
                x[0] ^= hit
                continue
            np.bitwise_xor(x[0], x[i], out=t)
            t &= p  # low bits of x0 ^ xi ...
            t &= ~hit  # ... only where the bit is clear
            x[0] ^= hit
            x[0] ^= t
            x[i] ^= t
    # Gray encode.
    for i in range(1, dim):
        x[i] ^= x[i - 1]
    t[:] = 0
    for level in range(bits - 1, 0, -1):
        np.right_shift(x[dim - 1], np.uint32(level), out=hit)
        hit &= np.uint32(1)
        np.subtract(zero, hit, out=hit)
        hit &= np.uint32((1 << level) - 1)
        t ^= hit
    for i in range(dim):
        x[i] ^= t
    return np.stack(x, axis=1)


_ENCODERS = {
    "morton": lambda q, bits: _interleave(q),
    "hilbert": lambda q, bits: _interleave(_hilbert_transpose(q, bits)),
}


def _check_bits(bits: Any, dim: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        msg = f"bits must be an int, got {bits!r}"
        raise TypeError(msg)
    if not 1 <= int(bits) <= _MAX_BITS[dim]:
        msg = f"bits={bits} must lie in [1, {_MAX_BITS[dim]}] for {dim}-D points"
        raise ValueError(msg)
    return int(bits)


def curve_order(codes: np.ndarray) -> np.ndarray:
    """Stable argsort of curve codes (ties by original index), deterministic and fast.

    When code bits plus index bits fit in 64 bits the index is packed below the code and a
    plain sort of unique keys is used; otherwise a stable sort.
    """
    n = codes.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    top = int(codes.max())
    code_bits = max(top.bit_length(), 1)
    idx_bits = max((n - 1).bit_length(), 1)
    if code_bits + idx_bits <= 64:
        key = (codes << np.uint64(idx_bits)) | np.arange(n, dtype=np.uint64)
        key.sort()
        return (key & np.uint64((1 << idx_bits) - 1)).astype(np.int64)
    return np.argsort(codes, kind="stable")


def group_by_shard(assignment: np.ndarray, parts: int, order: np.ndarray) -> np.ndarray:
    """Stored order: rows grouped by shard, each shard's rows in the order given by ``order``
    (e.g. a Hilbert :func:`curve_order`). Stable; int16 labels take numpy's radix sort."""
    dtype = np.int16 if parts < 2**15 else np.int64
    return order[np.argsort(assignment[order].astype(dtype), kind="stable")]


def split_curve(
    weights_sorted: np.ndarray | None,
    n: int,
    targets: np.ndarray,
    *,
    allow_empty: bool,
) -> np.ndarray:
    """Start offsets of each part along a sorted curve, cut by cumulative weight.

    A point goes to the part whose cumulative-target interval contains the midpoint of its
    weight interval. Unless ``allow_empty``, every part with a positive target gets at least
    one point when there are enough points.

    Returns
    -------
    ndarray of shape (P + 1,), int64
        ``ptr``: part ``p`` is sorted positions ``ptr[p]:ptr[p+1]``.
    """
    if weights_sorted is None:
        mid = np.arange(n, dtype=np.float64) + 0.5
        total = float(n)
    else:
        csum = np.cumsum(weights_sorted)
        mid = csum - 0.5 * weights_sorted
        total = float(csum[-1]) if n else 0.0
    bounds = np.cumsum(targets)[:-1] * total
    starts = np.searchsorted(mid, bounds, side="left").astype(np.int64)
    ptr = np.concatenate([[0], starts, [n]]).astype(np.int64)
    if not allow_empty and n >= int((targets > 0).sum()):
        ptr = _ensure_nonempty(ptr, targets > 0)
    return ptr


def _ensure_nonempty(ptr: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Shift cut positions minimally so every part in ``want`` holds >= 1 row (loop over P)."""
    ptr = ptr.copy()
    parts = want.size
    w = want.astype(np.int64)
    for p in range(parts - 1):  # forward: part p ends at least w[p] rows after it starts
        ptr[p + 1] = max(ptr[p + 1], ptr[p] + w[p])
    for p in range(parts - 1, 0, -1):  # backward: leave room for the parts after p
        ptr[p] = min(ptr[p], ptr[p + 1] - w[p])
    return ptr


def _sfc_partition(
    method: str,
    points: Any,
    parts: int,
    *,
    weights: Any = None,
    targets: Any = None,
    allow_empty: bool = False,
    bits: int | None = None,
) -> Partition:
    pts = as_points(points, keep_float=True)
    n, dim = pts.shape
    parts = check_parts(parts, n, allow_empty=allow_empty)
    w = check_weights(weights, n)
    t = check_targets(targets, parts)
    bits = default_bits(n, dim) if bits is None else _check_bits(bits, dim)
    codes = _encode(pts, bits, _ENCODERS[method])  # pts validated above
    order = curve_order(codes)
    ptr = split_curve(None if w is None else w[order], n, t, allow_empty=allow_empty)
    sizes = np.diff(ptr)
    assignment = np.empty(n, dtype=np.int64)
    assignment[order] = shard_labels(sizes)
    params = {"bits": bits, "targets": t.tolist(), "weighted": w is not None}
    return Partition(assignment, order, sizes, method=method, params=params)


def morton(points: Any, parts: int, *, weights: Any = None, targets: Any = None,
           allow_empty: bool = False, bits: int | None = None) -> Partition:  # fmt: skip
    """Cut points into ``parts`` contiguous pieces of the Morton (Z-order) curve.

    Parameters
    ----------
    points : array (numpy or torch) of shape (N, 3) or (N, 2)
    parts : int
        Number of shards P >= 1.
    weights : array of shape (N,), optional
        Non-negative per-point work; shards get equal (or ``targets``) shares of the total.
    targets : array of shape (P,), optional
        Fraction of the total weight per shard (sum 1; zeros give empty shards).
    allow_empty : bool
        Allow empty shards when N < P.
    bits : int, optional
        Grid resolution per axis.

    Returns
    -------
    Partition
        Rows of each shard in curve order.

    Examples
    --------
    >>> import numpy as np
    >>> p = morton(np.random.default_rng(0).random((1000, 3)), 4)
    >>> p.sizes.tolist()
    [250, 250, 250, 250]
    """
    return _sfc_partition(
        "morton", points, parts, weights=weights, targets=targets,
        allow_empty=allow_empty, bits=bits,
    )  # fmt: skip


def hilbert(points: Any, parts: int, *, weights: Any = None, targets: Any = None,
            allow_empty: bool = False, bits: int | None = None) -> Partition:  # fmt: skip
    """Cut points into ``parts`` contiguous pieces of the Hilbert curve.

    Same parameters as :func:`morton`. Hilbert pieces are connected on the grid, so they
    usually cut fewer neighbour edges than Morton pieces.

    Examples
    --------
    >>> import numpy as np
    >>> p = hilbert(np.random.default_rng(0).random((1000, 2)), 3, targets=[0.5, 0.25, 0.25])
    >>> p.sizes.tolist()
    [500, 250, 250]
    """
    return _sfc_partition(
        "hilbert", points, parts, weights=weights, targets=targets,
        allow_empty=allow_empty, bits=bits,
    )  # fmt: skip
