"""Halo exchange for the aten-level grid rules.

A grid rule reduces, per sharded spatial dim, to "rank r needs global rows ``needs[r]`` (in this
order, ``-1`` = a fill value)". Those plans are the pure functions of :mod:`.grid_plan`
(``sliding_plan``, ``transpose_plan``, ``pad_plan``): every rank computes every rank's needs
from the layout alone. This module turns one such plan
into this rank's exchange and runs it on local pieces:

- :func:`fetch` -- the window: local rows, rows received from their owners (one uneven
  ``all_to_all_single`` per sharded dim, only the rows that cross a cut move; a neighbour
  thinner than the halo, or empty, is skipped and the rows come from the ranks behind it),
  and fill rows. No collective at all when no rank needs another's rows (same answer on
  every rank, from the plan).
- :func:`fetch_transpose` -- its adjoint for the backward rules: gradients of received rows
  go back to their owners (the reverse all-to-all) and are summed into the local rows.
- :func:`check_hops` -- :func:`meshshard.shardtensor.grid.halo_limit`'s check of a plan.

Every all-to-all makes the collective check (``MESHSHARD_DEBUG_COLLECTIVES``) and, eagerly,
adds its bytes to :func:`meshshard.shardtensor.grid.count_halo_bytes`' counter.

Both are made of ``narrow``/``flip``/``cat``/``slice_scatter`` with Python-int bounds and a
functional collective, so they run eagerly and trace under ``torch.compile`` as graph nodes.
The plans need int sizes: under ``torch.compile`` the per-rank sizes are specialised (a guard
per layout), which is what a halo plan -- who owns which row -- is.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import torch

import meshshard.shardtensor.grid as _controls
from meshshard.shardtensor._aten.collective_ops import fc as _fc
from meshshard.shardtensor._aten.grid_plan import owner_of
from meshshard.shardtensor._aten.meshinfo import check
from meshshard.shardtensor._aten.meshinfo import coord as _coord
from meshshard.shardtensor.grid import HaloError


class Exchange(NamedTuple):
    """This rank's side of one plan along tensor dim ``dim`` (mesh dim ``mesh_dim``).
    Segments are ``(kind, start, length, step)``: ``kind`` "L" local rows, "R" received rows,
    "F" fill; ``step`` +1 or -1 (a mirrored run: reflect padding)."""

    dim: int
    mesh_dim: int
    moves: bool
    send: tuple  # segments of local rows, in send order (receivers ascending)
    send_counts: tuple
    recv_counts: tuple
    window: tuple  # segments building the window, in window order
    n_local: int
    n_window: int


def _runs(src: list[tuple[str, int]]) -> tuple:
    out: list[list] = []
    for kind, i in src:
        if out:
            k, a, n, st = out[-1]
            if k == kind == "F":
                out[-1][2] += 1
                continue
            if k == kind and n == 1 and i in (a + 1, a - 1):
                out[-1][2], out[-1][3] = 2, i - a
                continue
            if k == kind and n > 1 and i == a + st * n:
                out[-1][2] += 1
                continue
        out.append([kind, i, 1, 1])
    return tuple(tuple(r) for r in out)


@functools.lru_cache(maxsize=4096)
def exchange_plan(dim: int, mesh_dim: int, sizes: tuple, needs: tuple, me: int) -> Exchange:
    """This rank's exchange for every rank's ``needs`` over rows split ``sizes`` (cached)."""
    n = len(sizes)
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total = int(offs[-1])

    def owners(need):
        need = np.asarray(need, dtype=np.int64)
        own = np.full(need.shape, -1, dtype=np.int64)
        valid = need >= 0
        if np.any(need[valid] >= total):
            msg = f"halo plan: a row index >= the global size {total} of dim {dim}"
            raise ValueError(msg)
        own[valid] = owner_of(need[valid], sizes)
        return need, own

    send_src: list[tuple[str, int]] = []
    send_counts = []
    moves = False
    for r in range(n):
        need, own = owners(needs[r])
        if np.any((own >= 0) & (own != r)):
            moves = True
        if r == me:
            send_counts.append(0)
            continue
        rows = need[own == me] - offs[me]
        send_src.extend(("L", int(v)) for v in rows)
        send_counts.append(int(rows.size))
    need, own = owners(needs[me])
    recv_counts = [int(np.count_nonzero(own == q)) if q != me else 0 for q in range(n)]
    slot_base = np.concatenate([[0], np.cumsum(recv_counts)]).astype(np.int64)
    seen = [0] * n
    src: list[tuple[str, int]] = []
    for v, q in zip(need.tolist(), own.tolist()):
        if q < 0:
            src.append(("F", 0))
        elif q == me:
            src.append(("L", v - int(offs[me])))
        else:
            src.append(("R", int(slot_base[q]) + seen[q]))
            seen[q] += 1
    return Exchange(dim, mesh_dim, moves, _runs(send_src), tuple(send_counts),
                    tuple(recv_counts), _runs(src), int(sizes[me]), len(src))


def _rows(t: torch.Tensor, dim: int, a: int, n: int, step: int) -> torch.Tensor:
    if step == 1:
        return t.narrow(dim, a, n)
    return t.narrow(dim, a - n + 1, n).flip(dim)


@functools.lru_cache(maxsize=4096)
def check_hops(sizes: tuple, needs: tuple, periodic: bool, max_hops: int) -> None:
    """Raise :class:`HaloError` (alike on every rank: the plan is) when some rank's ``needs``
    reach rows owned ``max_hops`` mesh coordinates away or further (ring distance when
    ``periodic``)."""
    n = len(sizes)
    for r in range(n):
        nr = np.asarray(needs[r], dtype=np.int64)
        nr = nr[nr >= 0]
        if nr.size == 0:
            continue
        q = owner_of(nr, sizes)
        dist = np.abs(q - r)
        if periodic:
            dist = np.minimum(dist, n - dist)
        if int(dist.max()) > max_hops:
            far = int(q[np.argmax(dist)])
            msg = (
                f"halo too large for halo_limit(max_hops={max_hops}): rank {r} (rows "
                f"{list(sizes)}) needs rows owned by rank {far}, {int(dist.max())} ranks "
                "away; its neighbours are thinner than the halo. Rebalance the split "
                "(redistribute(sizes=...)) or raise max_hops"
            )
            raise HaloError(msg)


def _all_to_all(t: torch.Tensor, dim: int, out_counts, in_counts, mesh, mesh_dim: int,
                detail: str, phase: str | None) -> torch.Tensor:
    x = t.movedim(dim, 0).contiguous()
    check("all_to_all_single", mesh, mesh_dim, x, detail, varying_dim=0)
    stats = _controls.stats()
    if stats is not None and phase is not None and type(x) is torch.Tensor:
        nbytes = sum(in_counts) * x.element_size() * math.prod(x.shape[1:])
        if phase == "forward":
            stats.forward += nbytes
            stats.calls += 1
        else:
            stats.backward += nbytes
    name = _coord(mesh)[2][mesh_dim]
    y = _fc.wait_tensor(_fc.all_to_all_single(x, list(out_counts), list(in_counts), name))
    return y.movedim(0, dim)


def fetch(x: torch.Tensor, ex: Exchange, mesh, fill: float = 0.0, *,
          detail: str = "grid halo", phase: str | None = "forward") -> torch.Tensor:
    """The window of ``ex`` from this rank's rows ``x`` (collective over mesh dim
    ``ex.mesh_dim`` of ``mesh`` when ``ex.moves``). ``phase`` ("forward", "backward" or None:
    not a halo) says where :func:`meshshard.shardtensor.grid.count_halo_bytes` counts it."""
    d = ex.dim
    recv = None
    if ex.moves:
        parts = [_rows(x, d, a, n, st) for _, a, n, st in ex.send]
        send = torch.cat(parts, d) if parts else x.narrow(d, 0, 0)
        recv = _all_to_all(send, d, ex.recv_counts, ex.send_counts, mesh, ex.mesh_dim, detail,
                           phase)
    pieces = []
    for kind, a, n, st in ex.window:
        if kind == "L":
            pieces.append(_rows(x, d, a, n, st))
        elif kind == "R":
            pieces.append(_rows(recv, d, a, n, st))
        else:
            shape = list(x.shape)
            shape[d] = n
            pieces.append(x.new_full(shape, fill))
    out = x.narrow(d, 0, 0) if not pieces else pieces[0] if len(pieces) == 1 else \
        torch.cat(pieces, d)
    if ex.moves and not any(s[0] == "R" for s in ex.window):
        out = tie(out, recv)  # this rank receives nothing but must still take part
    return out


def tie(t: torch.Tensor, *deps) -> torch.Tensor:
    """``t``, depending on ``deps`` while tracing (a no-op eagerly). A collective whose result
    a rank does not use (it receives nothing, or its output is empty) would be removed from
    that rank's graph as dead code; a gradient that does not depend on the incoming gradient
    (zeros on an empty slab) would be moved into the forward graph by the partitioner, with
    the collectives after it. Either way the ranks' collectives would no longer match. Adds
    an empty slice's sum (0, also next to -inf fill rows)."""
    if type(t) is torch.Tensor:
        return t
    for d in deps:
        if d is not None:
            t = t + d.reshape(-1)[:0].sum().to(t.dtype)
    return t


def _add_rows(acc: torch.Tensor | None, shape: list, dim: int, a: int, n: int, step: int,
              g: torch.Tensor) -> torch.Tensor:
    if step == -1:
        a, g = a - n + 1, g.flip(dim)
    if acc is None:
        if a == 0 and n == shape[dim]:
            return g
        acc = g.new_zeros(shape)
    return acc.slice_scatter(acc.narrow(dim, a, n) + g, dim, a, a + n)


def fetch_transpose(g: torch.Tensor, ex: Exchange, local_shape, mesh) -> torch.Tensor:
    """Adjoint of :func:`fetch`: the gradient of this rank's rows from the window's gradient
    ``g`` (collective when ``ex.moves``; fill rows get no gradient; counted as backward)."""
    d = ex.dim
    shape = list(local_shape)
    acc = None
    pos = 0
    remote = []
    for kind, a, n, st in ex.window:
        if kind == "L":
            acc = _add_rows(acc, shape, d, a, n, st, g.narrow(d, pos, n))
        elif kind == "R":
            piece = g.narrow(d, pos, n)
            remote.append((a - n + 1 if st == -1 else a,
                           piece.flip(d) if st == -1 else piece))
        pos += n
    if ex.moves:
        remote.sort(key=lambda r: r[0])
        gshape = list(g.shape)
        gshape[d] = 0
        back = torch.cat([p for _, p in remote], d) if remote else g.new_zeros(gshape)
        sent = _all_to_all(back, d, ex.send_counts, ex.recv_counts, mesh, ex.mesh_dim,
                           "grid halo gradients", "backward")
        pos = 0
        for _, a, n, st in ex.send:
            acc = _add_rows(acc, shape, d, a, n, st, sent.narrow(d, pos, n))
            pos += n
    if acc is None:  # a zero gradient that still depends on g (see tie)
        acc = tie(g.new_zeros(shape), g)
    if ex.moves and not ex.send:
        acc = tie(acc, sent)
    return acc


def reshard_plan(dim: int, mesh_dim: int, src: tuple, dst: tuple, me: int) -> Exchange:
    """Rows split ``src`` -> split ``dst`` along ``dim`` (only rows that change owner move)."""
    offs = np.concatenate([[0], np.cumsum(dst)]).astype(np.int64)
    needs = tuple(tuple(range(int(offs[r]), int(offs[r + 1]))) for r in range(len(dst)))
    return exchange_plan(dim, mesh_dim, tuple(src), needs, me)
