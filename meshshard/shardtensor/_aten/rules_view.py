"""``view``/``reshape`` that split a sharded dim by whole rows, on any number of mesh dims.

``(B*H, N, D) -> (B, H, N, D)`` inside an einsum, with the batch sharded on mesh dim 0 and the
points on mesh dim 1 (data x domain): ``B*H`` is sharded with sizes ``b_r * H``, and splitting
it into ``(B, H)`` keeps every rank's rows whole (``b_r`` rows of the new outer dim). The
base rule (``rules._view``) maps a sharded coordinate into one output dim (a merge, or a
dim kept), and ``rules_shape._view`` splits a dim sharded on one mesh dim by moving rows; this
rule adds the split by whole rows, per mesh dim and independently of the others, so nothing
moves. Each mesh dim's sharded coordinate (extent ``n``, flat stride ``sigma``, per-rank sizes
``s``) lands in the output dim ``od`` with the largest stride ``st < sigma * n``: with
``b = st / sigma`` dividing every ``s_r``, rank r holds rows ``[off_r / b, (off_r + s_r) / b)``
of that coordinate, ``Shard(od)`` with sizes ``s / b`` (``Blocked`` when dims before it merge
into ``od`` too). Views this cannot map go on to the earlier rules (their errors included).
"""

from __future__ import annotations

import torch

from meshshard.shardtensor._aten import rules as _R
from meshshard.shardtensor._aten import rules_tp as _tp
from meshshard.shardtensor._aten.rules import Plan, _map_view_dim, register_rule

aten = torch.ops.aten
_EARLIER = _tp._view  # the view chain so far: rules_tp's, then rules_shape's, then rules


def _strides(shape: list) -> list:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc = acc * s
    return out[::-1]


def map_split(outs: list, sigma, n, sizes: tuple):
    """Where a sharded coordinate (extent ``n``, flat stride ``sigma``, per-rank ``sizes``)
    lands in a view of shape ``outs`` when the view splits it: (dim, blocks, new sizes), or
    None when some rank's rows would not stay whole."""
    best = None
    for od, (s, st) in enumerate(zip(outs, _strides(outs))):
        if s != 1 and sigma < st < sigma * n and (best is None or st > best[1]):
            best = (od, st, s)
    if best is None:
        return None
    od, st, s = best
    if st % sigma:
        return None
    b = st // sigma
    if n % b or any(v % b for v in sizes):
        return None
    m = n // b
    if s % m:
        return None
    return od, s // m, tuple(v // b for v in sizes)


def _map(outs: list, sigma, n, sizes: tuple):
    found = _map_view_dim(outs, sigma, n)
    if found is not None:
        od, blocks, q = found
        return od, blocks, sizes if q == 1 else tuple(v * q for v in sizes)
    return map_split(outs, sigma, n, sizes)


@register_rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
               extends=_EARLIER)
def _view(func, args, kwargs) -> Plan:
    spec = args[0]._spec
    used = set()

    def place(in_shape, out_shape, i, p, sigma):
        found = _map(out_shape, sigma, _R.extent(spec, i), spec.sizes[i])
        if found is None or found[0] in used:
            return None
        used.add(found[0])
        return found

    plan = _R.view_plan(args[0], args[1], place)
    return _EARLIER(func, args, kwargs) if plan is None else plan
