"""The ShardTensor-level neighbour ops: ``to_local()`` in, ``from_local(...)`` out.

Each function accepts either ShardTensors (points sharded along dim 0 on one mesh dim, every
other mesh dim Replicate) or plain local tensors with ``group=``; in the second case it is
exactly the :mod:`meshshard.ops.functional` / :mod:`meshshard.ops.halo` function. Outputs of
ShardTensor inputs are ShardTensors sharded like the queries, with sharding sizes known
without extra communication where possible. Everything is differentiable: ``to_local`` and
``from_local`` are, and the lower layer is.

Every function is collective over the sharded mesh dim (forward, and backward when gradients
flow).

Under ``torch.compile`` the neighbour queries (``knn``, ``radius``, ``knn_graph``,
``radius_graph``) run eagerly as one graph break each (``torch.compiler.disable``): their
search is data-dependent Python (tree walks, candidate exchanges whose sizes come from the
data) that Dynamo would otherwise cut into dozens of small graphs (measured: 34 graph breaks for
one ``knn`` on ShardTensors). The compiled code before and after stays one graph each, and
gradients flow through as in eager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from meshshard.errors import InputError
from meshshard.ops import functional as F
from meshshard.ops import halo as H
from meshshard.partition.record import HaloPlan
from meshshard.shardtensor import Replicate, Shard, ShardTensor
from meshshard.shardtensor import from_local as _st_from_local
from meshshard.shardtensor._aten import from_local as _aten_from_local

__all__ = [
    "gather_neighbors",
    "halo_exchange",
    "knn",
    "knn_graph",
    "radius",
    "radius_graph",
    "scatter_to_owners",
]


def _classes() -> tuple:
    return (ShardTensor,)


def _is_st(t: Any) -> bool:
    return isinstance(t, _classes())


# The ShardTensor class of the call's inputs:
# outputs are wrapped in the same class. Set by _layout, which every op calls first.
_CLS: list = [None]


def _layout(st, name: str, op: str):
    """(local, mesh, placements, mesh_dim, sizes, group) of a ShardTensor sharded on dim 0."""
    _CLS[0] = type(st)
    pl = tuple(st.placements)
    shard_dims = [i for i, p in enumerate(pl) if isinstance(p, Shard)]
    if len(shard_dims) != 1 or pl[shard_dims[0]].dim != 0:
        msg = (
            f"{op}: {name} must be sharded along dim 0 (points) on exactly one mesh dim, got "
            f"placements {pl}; redistribute to [Shard(0)] (plus Replicate on other mesh dims)"
        )
        raise ValueError(msg)
    md = shard_dims[0]
    if any(not isinstance(p, Replicate) for i, p in enumerate(pl) if i != md):
        msg = f"{op}: {name}'s other mesh dims must be Replicate, got placements {pl}"
        raise ValueError(msg)
    mesh = st.device_mesh
    return st.to_local(), mesh, pl, md, st.sharding_sizes(md), mesh.get_group(md)


def _plain_group(group: dist.ProcessGroup | None, op: str) -> dist.ProcessGroup | None:
    """``group`` for plain local tensors, checked: with no group given, the default one must
    exist (otherwise torch's "Default process group has not been initialized" would be the
    whole message)."""
    if group is not None or (dist.is_available() and dist.is_initialized()):
        return group
    msg = (
        f"ops.{op} on plain tensors runs over a process group, and none is initialised: call "
        "meshshard.comm.init() first (under torchrun each rank joins the job; in a plain "
        "python process it makes a world of one), or pass group="
    )
    if op in ("knn", "knn_graph"):
        msg += ("; on one process without torch.distributed, meshshard.ops.kernels.knn(x, y, k) "
                "is the local search (squared distances)")
    raise InputError(msg)


def _one_class(op: str, *ts: Any) -> None:
    kinds = {type(t) for t in ts if _is_st(t)}
    if len(kinds) > 1:
        names = ", ".join(sorted(k.__name__ for k in kinds))
        msg = f"{op}: the ShardTensor inputs are of different classes ({names}); use one"
        raise TypeError(msg)


def _from_local():
    if _CLS[0] is not None and _CLS[0] is not _classes()[0]:
        return _aten_from_local
    return _st_from_local


def _wrap(local: torch.Tensor, mesh, placements, sizes):
    return _from_local()(local, mesh, placements, sharding_shapes=list(sizes), validate=False)


def _wrap_inferred(local: torch.Tensor, mesh, placements):
    return _from_local()(local, mesh, placements, sharding_shapes=None)


def _pair(x, y, op: str):
    """Unwrap x (and y) consistently; returns (xl, yl, group, out_layout or None, x_sizes)."""
    if _is_st(x):
        xl, mesh, pl, md, xs, group = _layout(x, "x", op)
        if y is None:
            return xl, None, group, (mesh, pl, xs), xs
        if not _is_st(y):
            msg = (
                f"{op}: x is a ShardTensor but y is a {type(y).__name__}; pass both as ShardTensors"
            )
            raise TypeError(msg)
        if type(y) is not type(x):
            msg = (f"{op}: x and y are ShardTensors of different classes ({type(x).__name__}, "
                   f"{type(y).__name__}); make both the same")
            raise TypeError(msg)
        yl, ymesh, ypl, ymd, ys, _ = _layout(y, "y", op)
        if ymesh != mesh or ymd != md:
            msg = (
                f"{op}: x and y live on different device meshes / mesh dims ({mesh} dim {md} vs "
                f"{ymesh} dim {ymd}); put the queries on the points' mesh"
            )
            raise ValueError(msg)
        return xl, yl, group, (mesh, ypl, ys), xs
    if _is_st(y):
        msg = f"{op}: y is a ShardTensor but x is a {type(x).__name__}; pass both as ShardTensors"
        raise TypeError(msg)
    return x, y, None, None, None


@torch.compiler.disable
def knn(
    x,
    k: int,
    y=None,
    loop: bool = True,
    *,
    backend: str = "auto",
    group: dist.ProcessGroup | None = None,
    nboxes: int = 16,
    stats: dict | None = None,
):
    """Exact k nearest neighbours of every query among the points of all ranks.

    Collective: every rank of the mesh must call this (and ``backward`` when gradients flow).

    Parameters
    ----------
    x : ShardTensor of global shape (N, d), Shard(0) — or this rank's Tensor with ``group``
    k : int
        ``1 <= k <= N`` (``N - 1`` with ``loop=False``).
    y : ShardTensor of global shape (M, d), optional
        Queries on the same mesh; default ``x``.
    loop : bool
        With ``y=None``: ``False`` excludes each point itself.
    backend : {"auto", "kdtree", "grid", "brute", "cluster"}

    Returns
    -------
    dist : ShardTensor of shape (M, k), sharded like ``y``
        Ascending distances (differentiable w.r.t. ``x`` and ``y``).
    index : ShardTensor of shape (M, k), int64, sharded like ``y``
        Global indices in stored (partition) order; ties broken by the lower index.

    Example
    -------
    >>> d, idx = knn(points, 16, loop=False)  # doctest: +SKIP
    """
    xl, yl, g, out, xs = _pair(x, y, "knn")
    d, i = F.knn(
        xl,
        k,
        yl,
        loop=loop,
        group=g if out else _plain_group(group, "knn"),
        x_sizes=xs,
        backend=backend,
        nboxes=nboxes,
        stats=stats,
    )
    if out is None:
        return d, i
    return _wrap(d, *out), _wrap(i, *out)


@torch.compiler.disable
def radius(
    x,
    r: float,
    y=None,
    max_num_neighbors: int | None = None,
    *,
    loop: bool = True,
    format: str = "padded",
    backend: str = "auto",
    group: dist.ProcessGroup | None = None,
    nboxes: int = 16,
    stats: dict | None = None,
):
    """Exact ball query: all points within ``r`` (``<= r``), nearest first (ties by index).

    Collective: every rank of the mesh must call this (and ``backward`` when gradients flow).

    Parameters
    ----------
    x, y : ShardTensor of global shape (N, d) / (M, d), Shard(0), or local Tensors with ``group``
    r : float
    max_num_neighbors : int, optional
        Keep the *closest* ones when more lie in the ball.
    format : {"padded", "csr"}
        ``"padded"``: ``(dist, index)`` of shape (M, W), sharded like ``y``, padded with
        ``inf`` / ``-1``; ``W`` is the cap, or the largest count over all ranks.
        ``"csr"``: ``(ptr, index, dist)`` where ``ptr`` is this rank's local (m_local + 1,)
        Tensor and ``index`` / ``dist`` are ShardTensors of shape (E,) (sizes gathered).

    Returns
    -------
    tuple
        See ``format``; distances differentiable, indices global (stored order).
    """
    xl, yl, g, out, xs = _pair(x, y, "radius")
    res = F.radius(
        xl,
        r,
        yl,
        max_num_neighbors=max_num_neighbors,
        loop=loop,
        format=format,
        group=g if out else _plain_group(group, "radius"),
        backend=backend,
        nboxes=nboxes,
        stats=stats,
    )
    if out is None:
        return res
    if format == "padded":
        return _wrap(res[0], *out), _wrap(res[1], *out)
    mesh, pl, _ = out
    return res[0], _wrap_inferred(res[1], mesh, pl), _wrap_inferred(res[2], mesh, pl)


def _graph_out(edges: torch.Tensor, out):
    if out is None:
        return edges
    mesh, pl, _ = out
    md = next(i for i, p in enumerate(pl) if isinstance(p, Shard))
    epl = tuple(Shard(1) if i == md else p for i, p in enumerate(pl))
    return _wrap_inferred(edges, mesh, epl)


@torch.compiler.disable
def knn_graph(
    x,
    k: int,
    loop: bool = False,
    flow: str = "source_to_target",
    *,
    backend: str = "auto",
    group: dist.ProcessGroup | None = None,
    nboxes: int = 16,
):
    """kNN graph in torch_cluster's convention: ``edge_index`` of shape (2, N * k).

    ``flow="source_to_target"`` (default): row 0 = neighbour, row 1 = centre;
    ``"target_to_source"``: row 0 = centre, row 1 = neighbour. Global indices; each rank holds
    the edges of its own centres (a ShardTensor sharded along dim 1 for ShardTensor input).

    Collective: every rank of the mesh must call this.
    """
    xl, _, g, out, _ = _pair(x, None, "knn_graph")
    g = g if out else _plain_group(group, "knn_graph")
    e = F.knn_graph(xl, k, loop, flow, group=g, backend=backend, nboxes=nboxes)
    return _graph_out(e, out)


@torch.compiler.disable
def radius_graph(
    x,
    r: float,
    loop: bool = False,
    max_num_neighbors: int | None = None,
    flow: str = "source_to_target",
    *,
    backend: str = "auto",
    group: dist.ProcessGroup | None = None,
    nboxes: int = 16,
):
    """Radius graph in torch_cluster's convention (see :func:`knn_graph`); the cap (default
    ``None``: none) keeps the closest neighbours.

    Collective: every rank of the mesh must call this.
    """
    xl, _, g, out, _ = _pair(x, None, "radius_graph")
    e = F.radius_graph(
        xl,
        r,
        loop,
        max_num_neighbors,
        flow,
        group=g if out else _plain_group(group, "radius_graph"),
        backend=backend,
        nboxes=nboxes,
    )
    return _graph_out(e, out)


def halo_exchange(features, plan: HaloPlan, *, group: dist.ProcessGroup | None = None):
    """This rank's rows followed by its ghosts (grouped by source shard, increasing).

    For a ShardTensor input the result is a ShardTensor whose sharding sizes are
    ``sizes + plan.halo_sizes()`` (no extra communication). Differentiable: ghost gradients are
    summed at their owners. Collective.
    """
    if not _is_st(features):
        return H.halo_exchange(features, plan, group=_plain_group(group, "halo_exchange"))
    fl, mesh, pl, _, sizes, g = _layout(features, "features", "halo_exchange")
    out = H.halo_exchange(fl, plan, group=g)
    halo = plan.halo_sizes() if plan.nparts == len(sizes) else [0] * len(sizes)
    return _wrap(out, mesh, pl, [int(s) + int(h) for s, h in zip(sizes, halo)])


def gather_neighbors(
    features, index, *, group: dist.ProcessGroup | None = None, sizes: Sequence[int] | None = None
):
    """Rows of the distributed ``features`` at global ``index`` (any shape; ``-1`` -> zeros).

    Only referenced remote rows move, each once. With ShardTensors, ``index`` may be a
    ShardTensor sharded along dim 0 (the result is sharded like it) or this rank's Tensor
    (the result is a local Tensor). Differentiable; collective.
    """
    if not _is_st(features):
        group = _plain_group(group, "gather_neighbors")
        return H.gather_neighbors(features, index, group=group, sizes=sizes)
    _one_class("gather_neighbors", features, index)
    fl, mesh, _, _, fs, g = _layout(features, "features", "gather_neighbors")
    if _is_st(index):
        il, imesh, ipl, _, isz, _ = _layout(index, "index", "gather_neighbors")
        if imesh != mesh:
            msg = "gather_neighbors: features and index live on different device meshes"
            raise ValueError(msg)
        return _wrap(H.gather_neighbors(fl, il, group=g, sizes=fs), mesh, ipl, isz)
    return H.gather_neighbors(fl, index, group=g, sizes=fs)


def scatter_to_owners(
    values,
    index,
    reduce: str = "sum",
    *,
    like=None,
    sizes: Sequence[int] | None = None,
    group: dist.ProcessGroup | None = None,
):
    """Send ``values`` to the owner rows of global ``index`` and reduce (sum / mean / max).

    Parameters
    ----------
    values, index : ShardTensors sharded along dim 0 alike, or local Tensors
    like : ShardTensor, optional
        The distributed tensor whose rows ``index`` addresses; the result is sharded like it.
        Without it pass ``sizes`` (every rank's row count) and ``group``.

    Notes
    -----
    Differentiable; collective.
    """
    if _is_st(values) or _is_st(index) or _is_st(like):
        if not (_is_st(values) and _is_st(index) and _is_st(like)):
            msg = (
                "scatter_to_owners: with ShardTensors pass values, index and like= as ShardTensors"
            )
            raise TypeError(msg)
        _one_class("scatter_to_owners", values, index, like)
        vl, mesh, _, _, _, g = _layout(values, "values", "scatter_to_owners")
        il, *_ = _layout(index, "index", "scatter_to_owners")
        _, lmesh, lpl, _, lsz, _ = _layout(like, "like", "scatter_to_owners")
        if lmesh != mesh:
            msg = "scatter_to_owners: values and like live on different device meshes"
            raise ValueError(msg)
        return _wrap(H.scatter_to_owners(vl, il, reduce, sizes=lsz, group=g), mesh, lpl, lsz)
    if sizes is None:
        msg = "scatter_to_owners: pass sizes= (every rank's destination row count) for Tensors"
        raise ValueError(msg)
    group = _plain_group(group, "scatter_to_owners")
    return H.scatter_to_owners(values, index, reduce, sizes=sizes, group=group)
