"""Index dtypes and heap trimming for the memory budget of the distributed partitioner."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import numpy as np

__all__ = ["index_dtype", "trim_heap"]


def index_dtype(n_total: int) -> type:
    """dtype of row indices and positions: int32 when every global row fits (N < 2**31, the
    same on every rank), else int64."""
    return np.int32 if n_total < 2**31 else np.int64


def _libc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to trim
        return None


_TRIM = _libc_trim()


def trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    Between phases, many mid-sized chunk temporaries (below glibc's mmap threshold) leave
    freed pages in the heap that still count in the resident set; returning them keeps the
    per-rank peak close to the arrays actually alive."""
    if _TRIM is not None:
        _TRIM(0)
