"""The layout exchange of ``from_local``: every rank states what it passed, the states travel
in one small all-gather per mesh dim, and every rank judges the same records, so every rank
raises the same one-line error (naming the rank at fault and what it passed) or none does.

A rank's record (int64) holds: its global rank, the kind of its local problem (0: none), the
piece's ndim, shape, dtype and device type, its mesh coordinate, its placements, and a
fingerprint of the sharding sizes it declared. Nothing is raised before the exchange: a rank
whose arguments are malformed still takes part, with its problem in the record, so the others
never wait for a collective it will not join. Only when the judgement finds a problem do the
ranks exchange a second, text record (the faulty rank's own message or its declared sizes):
that costs nothing on the path where every rank is right.

The all-gathers go along each mesh dim in turn (a gather of gathers), so after ``mesh.ndim``
of them every rank holds every rank's record; a 1-D mesh needs one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.comm.check import check_collective
from meshshard.errors import LayoutError

__all__ = ["MAX_DIMS", "Problem", "Record", "exchange", "exchange_text", "judge", "sizes_key"]

MAX_DIMS = 16  # the most tensor dims a piece may have (the record's fixed shape field)
TEXT_BYTES = 480  # the longest message a rank contributes when something is wrong

# local problem kinds: every rank raises the faulty rank's exception type
ERROR_TYPES: tuple[type[Exception], ...] = (LayoutError, TypeError, NotImplementedError,
                                            ValueError, RuntimeError)


def _pack(s: str, words: int) -> list[int]:
    raw = s.encode()[: 8 * words].ljust(8 * words, b"\0")
    return [int.from_bytes(raw[8 * k : 8 * k + 8], "little", signed=True) for k in range(words)]


def _unpack(ws: list[int]) -> str:
    raw = b"".join(int(w).to_bytes(8, "little", signed=True) for w in ws)
    return raw.rstrip(b"\0").decode(errors="replace")


def sizes_key(sizes: Any) -> int:
    """A fingerprint of one mesh dim's declared sizes (-1: none declared)."""
    if sizes is None:
        return -1
    return (len(sizes) + sum((k + 1) * 1_000_003 * int(v) for k, v in enumerate(sizes))) % (
        1 << 61)


@dataclass(frozen=True)
class Record:
    """One rank's statement, as exchanged (see the module docstring)."""

    rank: int
    error: int  # 0, else 1 + index into ERROR_TYPES
    ndim: int  # -1: not a tensor
    shape: tuple[int, ...]
    dtype: str
    device: str
    coord: tuple[int, ...]
    placements: tuple[tuple[int, int, str], ...]  # (kind 0 R / 1 S / 2 P / -1 bad, dim, op)
    declared: tuple[int, ...]  # per mesh dim, sizes_key of the declared sizes

    @staticmethod
    def width(mesh_ndim: int) -> int:
        return 3 + MAX_DIMS + 2 + 2 + mesh_ndim + 3 * mesh_ndim + mesh_ndim

    def encode(self) -> list[int]:
        shape = list(self.shape[:MAX_DIMS]) + [-1] * (MAX_DIMS - min(len(self.shape), MAX_DIMS))
        out = [self.rank, self.error, self.ndim, *shape, *_pack(self.dtype, 2),
               *_pack(self.device, 2), *self.coord]
        for kind, dim, op in self.placements:
            out += [kind, dim, _pack(op, 1)[0]]
        return out + list(self.declared)

    @classmethod
    def decode(cls, v: list[int], mesh_ndim: int) -> Record:
        k = 3 + MAX_DIMS
        ndim = v[2]
        shape = tuple(v[3 : 3 + max(0, min(ndim, MAX_DIMS))])
        dtype, device = _unpack(v[k : k + 2]), _unpack(v[k + 2 : k + 4])
        k += 4
        coord = tuple(v[k : k + mesh_ndim])
        k += mesh_ndim
        pl = tuple((v[k + 3 * i], v[k + 3 * i + 1], _unpack([v[k + 3 * i + 2]]))
                   for i in range(mesh_ndim))
        k += 3 * mesh_ndim
        return cls(v[0], v[1], ndim, shape, dtype, device, coord, pl,
                   tuple(v[k : k + mesh_ndim]))

    def placement_objs(self) -> tuple:
        return tuple(Shard(d) if kind == 1 else Partial(op) if kind == 2 else Replicate()
                     for kind, d, op in self.placements)


def _gather_rows(mesh, dims: list[int], row: torch.Tensor, detail: str) -> torch.Tensor:
    """Every row of the ranks spanned by mesh dims ``dims`` (a gather of gathers)."""
    buf = row[None]
    for i in dims:
        n = mesh.size(i)
        if n == 1:
            continue
        parts = [torch.empty_like(buf) for _ in range(n)]
        group = mesh.get_group(i)
        check_collective("all_gather", group, buf, detail=detail)
        dist.all_gather(parts, buf.contiguous(), group=group)
        buf = torch.cat(parts)
    return buf


def exchange(mesh, dims: list[int], mine: Record, device: torch.device) -> list[Record]:
    """Every record of the ranks spanned by ``dims``, sorted by rank. Collective over those
    mesh dims (one all-gather per dim of size > 1)."""
    row = torch.tensor(mine.encode(), dtype=torch.int64, device=device)
    rows = _gather_rows(mesh, dims, row, "from_local layout").tolist()
    return sorted((Record.decode(r, mesh.ndim) for r in rows), key=lambda r: r.rank)


def exchange_text(mesh, dims: list[int], rank: int, text: str,
                  device: torch.device) -> dict[int, str]:
    """Every rank's ``text`` (at most :data:`TEXT_BYTES` bytes each), by rank: the second
    exchange, run only when the records show a problem. Collective like :func:`exchange`."""
    text = " ".join(text.split())
    raw = (text[len("from_local: "):] if text.startswith("from_local: ") else text).encode()
    if len(raw) > TEXT_BYTES - 8:
        raw = raw[: TEXT_BYTES - 11] + b"..."
    buf = list(rank.to_bytes(8, "little")) + list(raw.ljust(TEXT_BYTES - 8, b"\0"))
    row = torch.tensor(buf, dtype=torch.uint8, device=device)
    out = {}
    for r in _gather_rows(mesh, dims, row, "from_local problem text").cpu().tolist():
        b = bytes(r)
        out[int.from_bytes(b[:8], "little")] = b[8:].rstrip(b"\0").decode(errors="replace")
    return out


@dataclass(frozen=True)
class Problem:
    """What the records show to be wrong; the message may need every rank's text."""

    kind: type[Exception]
    needs_text: bool
    head: str  # the whole message, or (needs_text) a template filled by :meth:`message`
    ranks: tuple[int, ...] = ()
    mesh_dim: int = -1

    def message(self, texts: dict[int, str], records: list[Record]) -> str:
        if not self.needs_text:
            return self.head
        if self.mesh_dim < 0:  # local problems: each faulty rank's own message
            groups: dict[str, list[int]] = {}
            for r in self.ranks:
                groups.setdefault(texts.get(r, "?"), []).append(r)
            parts = [f"{_who(rs, records)}: {t}" for t, rs in groups.items()]
            return "from_local: " + "; ".join(parts)
        i = self.mesh_dim
        declared: dict[str, list[int]] = {}
        for r in self.ranks:
            decl = texts.get(r, "").split(";")
            declared.setdefault(decl[i] if i < len(decl) else "?", []).append(r)
        actual = f"the actual local sizes {self.head}"
        if len(declared) == 1 and len(self.ranks) == len(records):
            (d,) = declared
            return (f"from_local: declared sharding sizes {d} on mesh dim {i} disagree with "
                    f"{actual} (every rank declared them)")
        parts = [f"{_who(rs, records)} declared sharding sizes {d}" for d, rs in declared.items()]
        return (f"from_local: ranks declared different sharding sizes on mesh dim {i}: "
                f"{', '.join(parts)}, but {actual}: pass those on every rank")


def _who(ranks: list[int] | tuple[int, ...], records: list[Record]) -> str:
    """``rank 3`` (with its mesh coordinate on an N-D mesh) or ``ranks 0, 1`` (a long list is
    cut to its first and last ranks, so the message stays one readable line)."""
    coords = {r.rank: r.coord for r in records}
    show = len(next(iter(coords.values()), ())) > 1 and len(ranks) == 1

    def one(r: int) -> str:
        return f"{r} (mesh coordinate {coords[r]})" if show and r in coords else str(r)

    if len(ranks) > 6:
        names = (f"{', '.join(one(r) for r in ranks[:3])}, ..., {one(ranks[-1])} "
                 f"({len(ranks)} ranks)")
    else:
        names = ", ".join(one(r) for r in ranks)
    return f"rank {names}" if len(ranks) == 1 else f"ranks {names}"


def _odd_ones(records: list[Record], key, show, what: str, fix: str) -> Problem | None:
    """The ranks whose ``key`` differs from the most common one (ties: rank order)."""
    groups: dict[Any, list[int]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r.rank)
    if len(groups) == 1:
        return None
    ref = max(groups, key=lambda k: (len(groups[k]), -min(groups[k])))
    by = {r.rank: r for r in records}
    odd = [f"{_who(rs, records)} passed {show(by[rs[0]])}" for k, rs in groups.items() if k != ref]
    faulty = tuple(r for k, rs in groups.items() if k != ref for r in rs)
    msg = (f"from_local: {what} differ across ranks: {', '.join(odd)} where "
           f"{_who(groups[ref], records)} passed {show(by[groups[ref][0]])}; {fix}")
    return Problem(LayoutError, False, msg, faulty)


def judge(records: list[Record], own_shape: bool = True) -> tuple[list | None, Problem | None]:
    """Every rank's sizes of each sharded mesh dim (None for the others), or the problem.
    Deterministic in ``records``, so every rank reaches the same verdict."""
    bad = [r for r in records if r.error]
    if bad:
        kind = ERROR_TYPES[bad[0].error - 1]
        return None, Problem(kind, True, "", tuple(r.rank for r in bad))
    mesh_ndim = len(records[0].coord)
    for what, key, show, fix in (
        ("placements", lambda r: r.placements, lambda r: list(r.placement_objs()),
         "pass the same placements on every rank"),
        ("tensor ranks", lambda r: r.ndim, lambda r: f"a {r.ndim}-d piece {r.shape}",
         "every rank's piece needs the same number of dims"),
        ("dtypes", lambda r: r.dtype, lambda r: f"a piece of dtype {r.dtype}",
         "convert every rank's piece to one dtype (.to(dtype)) first"),
        ("device types", lambda r: r.device, lambda r: f"a piece on {r.device}",
         "move every rank's piece to the mesh's device type first"),
    ):
        p = _odd_ones(records, key, show, what, fix)
        if p is not None:
            return None, p
    placements = records[0].placement_objs()
    sharded = {p.dim: i for i, p in enumerate(placements) if isinstance(p, Shard)}
    ndim = records[0].ndim
    for d in range(ndim):  # dims not sharded: one size on every rank
        if d in sharded:
            continue
        fix = (f"pieces may differ only in the sharded dim(s) {tuple(sorted(sharded))}"
               if sharded else "a tensor sharded nowhere has one shape on every rank")
        p = _odd_ones(records, lambda r, d=d: r.shape[d], lambda r: f"shape {r.shape}",
                      "local shapes", fix)
        if p is not None:
            return None, p
    sizes: list[tuple[int, ...] | None] = [None] * mesh_ndim
    for d, i in sharded.items():  # a sharded dim's size may depend on that coordinate only
        at: dict[int, list[Record]] = {}
        for r in records:
            at.setdefault(r.coord[i], []).append(r)
        for c, rs in sorted(at.items()):
            p = _odd_ones(rs, lambda r, d=d: r.shape[d], lambda r: f"shape {r.shape}",
                          f"sizes along tensor dim {d} at coordinate {c} of mesh dim {i}",
                          f"ranks at one coordinate of mesh dim {i} hold the same rows")
            if p is not None:
                return None, p
        sizes[i] = tuple(at[c][0].shape[d] for c in sorted(at))
    for i, s in enumerate(sizes):
        if s is None:
            continue
        want = sizes_key(s)
        wrong = tuple(r.rank for r in records if r.declared[i] not in (-1, want))
        if wrong:
            d = placements[i].dim
            head = f"{s} of tensor dim {d}"
            return None, Problem(LayoutError, True, head, wrong, mesh_dim=i)
    return sizes, None
