"""Debug mode for diverging ranks: before a collective, the ranks agree on what they will do.

When one rank calls a collective that the others do not (``loss.item()`` of a Partial value on
rank 0 only is the classic case), the ranks pair unrelated collectives: they hang until the
process group's timeout, or worse, exchange the wrong data silently. With
``MESHSHARD_DEBUG_COLLECTIVES=1`` in the environment of every rank, each of meshshard's
collectives first calls :func:`check_collective`: one small ``all_gather`` of a fingerprint of
the call (op, dtype, the shape that must agree, the caller's line, a per-group call number).
When the fingerprints differ, every rank of the group raises :class:`CollectiveMismatchError`
naming the rank(s) that differ and each distinct call, before any data moves.

With the variable unset (or ``0``), :func:`check_collective` returns at its first line: no
communication, no allocation. :func:`set_debug` switches the mode in a running process.

Any other code that calls ``torch.distributed`` collectives (a ring attention module, a
training loop) can make the same check with one line before its collective::

    check_collective("all_to_all_single", group, x, varying_dim=0, detail="ring step")

The caller's line (the first frame outside meshshard's communication code and torch) is part
of the fingerprint: every rank must reach the collective through the same line of code, as
ranks running one script do.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from typing import Any

from meshshard.errors import DistributedError

__all__ = [
    "DEBUG_ENV",
    "CollectiveMismatchError",
    "CollectiveWaitError",
    "check_collective",
    "debug_enabled",
    "set_debug",
]

DEBUG_ENV = "MESHSHARD_DEBUG_COLLECTIVES"
_MAX_TEXT = 2048


def _env_flag() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


_enabled: bool = _env_flag()
_calls: dict[Any, int] = {}


def debug_enabled() -> bool:
    """Whether the collective check is on in this process."""
    return _enabled


def set_debug(enabled: bool | None = None) -> None:
    """Switch the collective check on or off (``None``: read ``MESHSHARD_DEBUG_COLLECTIVES``
    again). Every rank must be in the same mode: a check is itself a collective."""
    global _enabled
    _enabled = _env_flag() if enabled is None else bool(enabled)


class CollectiveMismatchError(DistributedError):
    """The ranks of a process group were about to make different collective calls.

    Raised on every rank of the group at once (they all see the same fingerprints).

    Attributes
    ----------
    calls : dict[int, str]
        Group rank -> description of the call it was about to make.
    differing : list[int]
        Group ranks whose call differs from the majority's (every rank when there is none).
    group_ranks : list[int]
        Global ranks of the group, in group-rank order.
    """

    def __init__(self, calls: dict[int, str], group_ranks: list[int], me: int):
        self.calls = dict(sorted(calls.items()))
        self.group_ranks = list(group_ranks)
        by_call: dict[str, list[int]] = {}
        for r, c in self.calls.items():
            by_call.setdefault(c, []).append(r)
        groups = sorted(by_call.items(), key=lambda kv: (-len(kv[1]), kv[1]))
        top = len(groups[0][1])
        majority = top > len(self.calls) - top
        self.differing = sorted(
            r for c, rs in (groups[1:] if majority else groups) for r in rs
        )
        lines = [
            f"collective mismatch on rank {self.group_ranks[me]} (group rank {me}): the ranks "
            f"of process group {self.group_ranks} were about to make different collective "
            f"calls; rank(s) {self._names(self.differing)} differ"
            + (f" from rank(s) {self._names(groups[0][1])}" if majority else "")
            + ":"
        ]
        for call, rs in groups:
            lines.append(f"  rank(s) {self._names(rs)}: {call}")
        lines.append(
            "Every rank of a group must make the same collective calls in the same order; a "
            "rank-dependent branch around a collective (e.g. `.item()` or `print` of a "
            "Partial ShardTensor on rank 0 only) breaks this."
        )
        super().__init__("\n".join(lines))

    def _names(self, group_ranks: list[int]) -> list[int]:
        return [self.group_ranks[r] for r in group_ranks]


class CollectiveWaitError(DistributedError):
    """The collective check itself failed: another rank never arrived (timeout) or left."""


def check_collective(
    op: str,
    group: Any = None,
    tensor: Any = None,
    *,
    varying_dim: int | None = None,
    detail: str = "",
) -> None:
    """In debug mode, make every rank of ``group`` agree on the collective about to run.

    A no-op unless ``MESHSHARD_DEBUG_COLLECTIVES`` is set (or :func:`set_debug` was called).

    Collective (in debug mode): every rank of ``group`` must call this, right before the
    collective it describes.

    Parameters
    ----------
    op : str
        The collective's name, e.g. ``"all_reduce"``.
    group : ProcessGroup, optional
        The group the collective runs on (default: the world).
    tensor : Tensor, optional
        The tensor sent; its dtype and shape must agree across ranks.
    varying_dim : int, optional
        A dim whose size may differ per rank (e.g. 0 for ``all_to_all_single``).
    detail : str
        Anything else that must agree (reduce op, source rank, purpose).

    Raises
    ------
    CollectiveMismatchError
        On every rank of the group, when the ranks' calls differ.
    CollectiveWaitError
        When the check's own ``all_gather`` fails: a rank never arrived within the process
        group's timeout, or left.
    """
    if not _enabled:
        return
    _check(op, group, tensor, varying_dim, detail)


def _describe(op: str, tensor: Any, varying_dim: int | None, detail: str) -> str:
    text = op + (f"({detail})" if detail else "")
    if tensor is not None:
        dims = [str(s) for s in tensor.shape]
        if varying_dim is not None and dims:
            dims[varying_dim] = "*"
        dtype = str(tensor.dtype).removeprefix("torch.")
        text += f" {dtype}[{', '.join(dims)}]"
    return text


@functools.cache
def _internal_dirs() -> tuple[str, ...]:
    import torch

    comm = os.path.dirname(os.path.abspath(__file__))
    pkg = os.path.dirname(comm)
    return (
        os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
        os.path.join(pkg, "shardtensor") + os.sep,
        os.path.join(pkg, "ops") + os.sep,
        comm + os.sep,
    )


def _caller() -> tuple[str, str]:
    """(where, key): the first frame outside meshshard's communication code and torch."""
    skip = _internal_dirs()
    f = sys._getframe(2)
    first = f
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(skip):
        f = f.f_back
    f = f or first
    code = f.f_code
    where = f"{os.path.basename(code.co_filename)}:{f.f_lineno} in {code.co_name}"
    key = f"{f.f_globals.get('__name__', '?')}:{code.co_name}:{f.f_lineno}"
    return where, key


def _device(group: Any, tensor: Any):
    import torch
    import torch.distributed as dist

    if tensor is not None:
        return tensor.device
    if "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check(op: str, group: Any, tensor: Any, varying_dim: int | None, detail: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        return
    pg = group if group is not None else c10d._get_default_group()
    n = dist.get_world_size(pg)
    if n <= 1:
        return
    me = dist.get_rank(pg)
    key = getattr(pg, "group_name", None) or id(pg)
    seq = _calls.get(key, 0) + 1
    _calls[key] = seq
    where, where_key = _caller()
    what = _describe(op, tensor, varying_dim, detail)
    text = f"{what} at {where} (call #{seq} checked on this group)"
    digest = hashlib.blake2b(f"{what}|{where_key}|{seq}".encode(), digest_size=8).digest()
    payload = text.encode()[:_MAX_TEXT]
    dev = _device(pg, tensor)
    mine = torch.tensor(
        [int.from_bytes(digest, "little", signed=True), len(payload)], dtype=torch.int64,
        device=dev,
    )
    rows = [torch.empty_like(mine) for _ in range(n)]
    ranks = dist.get_process_group_ranks(pg)
    try:
        dist.all_gather(rows, mine, group=pg)
    except Exception as exc:
        msg = (
            f"rank {ranks[me]}: the ranks of process group {ranks} did not all arrive to "
            f"agree on the next collective, {text} ({type(exc).__name__}: {exc}). A rank "
            "that stalled, skipped this collective or exited is the cause; "
            "meshshard.testing.run_ranks and torchrun (after meshshard.comm.process.init) show "
            "each rank's stack. MESHSHARD_TIMEOUT sets how long ranks wait."
        )
        raise CollectiveWaitError(msg) from exc
    got = torch.stack(rows).cpu().tolist()
    if all(r[0] == got[0][0] for r in got):
        return
    # every rank saw the same rows, so all take this branch together
    width = max(r[1] for r in got)
    buf = torch.zeros(width, dtype=torch.uint8)
    buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    buf = buf.to(dev)
    texts = [torch.empty_like(buf) for _ in range(n)]
    dist.all_gather(texts, buf, group=pg)
    calls = {
        r: bytes(t[: got[r][1]].cpu().tolist()).decode(errors="replace")
        for r, t in enumerate(texts)
    }
    raise CollectiveMismatchError(calls, ranks, me)
