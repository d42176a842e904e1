"""Unmodified PyG ``MessagePassing`` layers on the aten-level ShardTensor: the
scatter side of message passing, row-local like :mod:`.graph_rows`'s gather.

PyG gathers with ``x.index_select(-2, edge_index[j])`` (row-local already, see
:mod:`.graph_rows`) and aggregates with
``msgs.new_zeros((dim_size, F)).scatter_add_(0, index.view(-1, 1).expand_as(msgs), msgs)``
(``scatter_reduce_`` for min/max/mul, ``scatter_`` for "any", two ``scatter_add_`` for mean),
where ``dim_size`` is ``x.size(0)``, the global row count of the node tensor. Two rules make
that local and exact:

- **the target's layout** (``new_zeros`` / ``new_ones`` / ``new_full`` / ``new_empty`` at
  function level): every row-local gather ``x[idx]`` records that index layout -> node layout
  (mesh, the index's per-rank sizes and ``x``'s global rows -> ``x``'s per-rank sizes). A new
  tensor made from a tensor in such an index (edge) layout with ``size[0]`` equal to that
  node count is a ``Shard(0)`` tensor in the node layout (this rank allocates only its rows);
  with ``size[0]`` equal to its own rows it keeps its own layout (PyG's per-edge ones of the
  mean). The latest gather wins if two node layouts share an index layout and a row count.
- **row-local scatter and gather** (``scatter_add(_)``, ``scatter_reduce(_)``, ``scatter(_)``,
  ``gather`` along dim 0): a ``Shard(0)`` index on the target's 1-D mesh names rows of the
  target *on the same rank* (global row ids; checked eagerly, a clear error naming the rank
  and rows otherwise), the values are sharded like the index. The op runs on the local pieces,
  forward and backward (autograd's formulas for these ops are made of the same ops), so no data
  moves. Before this module such a call was refused; every other layout keeps its rule.

With :class:`meshshard.graph.GraphPlug`'s ``edge_index`` the target is the extended layout.
Every in-edge of an owned node is held by its owner (the graph's edge-ownership rule), so the
owned rows of a layer's output are exact and there are no partial sums of owned nodes on other
ranks to send back; ghost rows hold only what local edges give (zero with one ring), so they
must be refreshed (``plug.before_layer``) before a layer reads them, as with the plug's own
``aggregate``. Under plain ``torch.compile`` with static sizes the same rules run while tracing
(0 graph breaks, equal to eager); with symbolic sizes nothing is recorded and the scatter
refuses with the error below.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Shard

from meshshard.shardtensor._aten.dispatch import _coord, _execute
from meshshard.shardtensor._aten.registry import DIRECT, register_rule, rule_for
from meshshard.shardtensor._aten.tensor import ShardTensor, make_spec
from meshshard.shardtensor.rules import graph_rows as _G
from meshshard.shardtensor.rules import grid_norm as _N  # noqa: F401  (its rules first)
from meshshard.shardtensor.rules import index as _I  # noqa: F401  (its rules first)
from meshshard.shardtensor.rules.pointwise import _pointwise

aten = torch.ops.aten

# (mesh, index per-rank sizes, node global rows) -> node per-rank sizes; (mesh, index sizes)
_NODE_LAYOUTS: dict = {}
_INDEX_LAYOUTS: set = set()


def _rows1d(t) -> bool:
    """A ShardTensor ``Shard(0)`` on a 1-D mesh."""
    return type(t) is ShardTensor and t._spec.mesh.ndim == 1 and \
        t._spec.placements[0] == Shard(0)


def _record(x, idx) -> None:
    if _rows1d(x) and _rows1d(idx) and x._spec.mesh is idx._spec.mesh:
        key = (x._spec.mesh, tuple(idx._spec.sizes[0]), x.shape[0])
        if len(_NODE_LAYOUTS) > 4096:
            _NODE_LAYOUTS.clear()
            _INDEX_LAYOUTS.clear()
        try:
            _NODE_LAYOUTS[key] = tuple(x._spec.sizes[0])
            _INDEX_LAYOUTS.add(key[:2])
        except TypeError:  # symbolic sizes (dynamic shapes): not recorded
            pass


def _recording(fn, index_pos: int):
    def wrapped(*args, **kwargs):
        try:
            out = fn(*args, **kwargs)
        except ValueError as e:
            if "outside its own rows" not in str(e):
                raise
            msg = (f"{e}. With GraphPlug.edge_index, gather from the extended layout: "
                   "h = plug.begin(x) (and plug.before_layer(h, layer) between layers)")
            raise ValueError(msg) from None
        if out is not NotImplemented:
            _record(args[0], args[index_pos] if len(args) > index_pos
                    else kwargs.get("index"))
        return out

    return wrapped


# the row gathers of graph_rows, extended to record the node layouts they see
register_rule(torch.Tensor.__getitem__, extends=_G._getitem)(_recording(_G._getitem, 1))
register_rule(torch.Tensor.index_select, torch.index_select,
              extends=_G._index_select)(_recording(_G._index_select, 2))


# ------------------------------------------------------------------ new_* at function level
def _size_of(args: tuple) -> tuple | None:
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = tuple(args[0])
    if not all(isinstance(s, int) for s in args):
        return None
    return tuple(int(s) for s in args)


def _node_sizes(src: ShardTensor, size: tuple) -> tuple | None:
    if not size or not _rows1d(src):
        return None
    spec = src._spec
    own = tuple(spec.sizes[0])
    try:
        hit = _NODE_LAYOUTS.get((spec.mesh, own, size[0]))
        if hit is not None:
            return hit
        if size[0] == src.shape[0] and (spec.mesh, own) in _INDEX_LAYOUTS:
            return own  # per-edge values of an index layout (PyG's ones of the mean)
    except TypeError:  # symbolic sizes (dynamic shapes): the scatter then says what is missing
        pass
    return None


def _new_factory(name: str, has_fill: bool):
    def new(src, *args, **kwargs):
        if type(src) is not ShardTensor or kwargs.get("requires_grad"):
            return NotImplemented
        if has_fill:
            if not args:
                return NotImplemented
            size, fill = _size_of(args[:1]), args[1] if len(args) > 1 else kwargs.get(
                "fill_value")
            if fill is None:
                return NotImplemented
        else:
            size = _size_of(args) if args else _size_of((kwargs.get("size", ()),))
        if size is None:
            return NotImplemented
        sizes = _node_sizes(src, size)
        if sizes is None:
            return NotImplemented
        kw = {k: v for k, v in kwargs.items() if k in ("dtype", "device", "layout",
                                                         "pin_memory") and v is not None}
        shape = (sizes[_coord(src._spec.mesh)[1][0]], *size[1:])
        loc = src._local
        local = loc.new_full(shape, fill, **kw) if has_fill else getattr(loc, name)(shape,
                                                                                     **kw)
        spec = make_spec(src._spec.mesh, (Shard(0),), (sizes,), size)
        return ShardTensor(local, spec)

    return new


for _name, _fill in (("new_zeros", False), ("new_ones", False), ("new_empty", False),
                     ("new_full", True)):
    register_rule(getattr(torch.Tensor, _name))(_new_factory(_name, _fill))


# ------------------------------------------------------------------ row-local scatter / gather
def _row_local(func, args) -> bool:
    """``args`` = (target, dim, index, [src], ...): index Shard(0) on the target's 1-D mesh
    along a Shard(0) dim 0 (the case no other rule takes)."""
    t, dim, idx = args[0], args[1], args[2]
    if type(idx) is not ShardTensor or idx._spec.placements[0] != Shard(0):
        return False
    if type(t) is not ShardTensor and idx._spec.mesh.ndim == 1 and dim % max(t.ndim, 1) == 0:
        msg = (
            f"{func}: a plain (global) target of {t.shape[0]} rows with a row-sharded index: "
            "the result would have to be the whole global tensor on every rank. Make the "
            "target from the sharded values (values.new_zeros(...), as PyG's scatter does); "
            "PyG code that builds per-edge values with torch.ones(E) (GCNConv's gcn_norm, "
            "normalize=True) is not covered on ShardTensors"
        )
        raise ValueError(msg)
    if type(t) is not ShardTensor or not (_rows1d(t) and t._spec.mesh is idx._spec.mesh):
        if type(t) is ShardTensor and dim % max(t.ndim, 1) == 0 and \
                idx._spec.mesh.ndim == 1 and t._spec.mesh is idx._spec.mesh:
            msg = (
                f"{func}: a row-sharded index into a target of {t.shape[0]} rows laid out "
                f"{t._spec}: the target's row layout is unknown. A target made by new_zeros "
                "takes the node layout of the last row-local gather with this index layout "
                "(x.index_select(0, edge_index[j]) on the node tensor, as PyG's "
                "MessagePassing does) — gather first, or use meshshard.graph.GraphPlug"
                ".aggregate"
            )
            raise ValueError(msg)
        return False
    return dim % t.ndim == 0


def _checked_ids(func, t: ShardTensor, idx: ShardTensor) -> torch.Tensor:
    try:
        return _G._local_ids(t._spec, idx, str(func))
    except ValueError as e:  # also name the PyG path
        msg = f"{e}. (PyG's MessagePassing: pass GraphPlug.edge_index with the plug's layouts)"
        raise ValueError(msg) from None


def _src_local(func, src, idx: ShardTensor):
    if not isinstance(src, torch.Tensor):
        return src  # a scalar value
    if type(src) is not ShardTensor or src._spec.mesh is not idx._spec.mesh or \
            src._spec.placements[0] != Shard(0) or src._spec.sizes != idx._spec.sizes:
        spec = src._spec if type(src) is ShardTensor else "a plain tensor"
        msg = (f"{func}: the values ({spec}) must be sharded like the row-sharded index "
               f"({idx._spec})")
        raise ValueError(msg)
    return src._local


def _call(prev, func, args, kwargs):
    """The rule this module wraps, for the layouts it leaves alone."""
    if prev in DIRECT:
        return prev(func, args, kwargs)
    return _execute(func, args, kwargs, prev(func, args, kwargs))


def _wrap(prev):
    def run(func, args, kwargs):
        if not _row_local(func, args):
            return _call(prev, func, args, kwargs)
        t, idx = args[0], args[2]
        ids = _checked_ids(func, t, idx)
        rest = list(args[3:])
        if rest:
            rest[0] = _src_local(func, rest[0], idx)
        if func is aten.gather.default:
            out = func(t._local, 0, ids, *rest, **kwargs)
            spec = make_spec(t._spec.mesh, (Shard(0),), idx._spec.sizes, tuple(idx.shape))
            return ShardTensor(out, spec)
        out = func(t._local, 0, ids, *rest, **kwargs)
        if func._schema.name.endswith("_"):  # in place: t's piece was mutated
            return t
        return ShardTensor(out, t._spec)

    return run


for _op in (aten.gather.default, aten.scatter_add.default, aten.scatter_add_.default,
            aten.scatter_reduce.two, aten.scatter_reduce_.two, aten.scatter.src,
            aten.scatter.value, aten.scatter_.src, aten.scatter_.value):
    _base = rule_for(_op).fn  # index.py's, for the layouts this one leaves alone
    register_rule(_op, direct=True, extends=_base)(_wrap(_base))


# ------------------------------------------------------------------ activations PyG layers use
# GATConv's attention (leaky_relu_backward is not tagged pointwise)
register_rule(aten.leaky_relu_backward.default)(_pointwise)


# ------------------------------------------------------------------ statistics over ghost rows
# (mesh, per-rank sizes) of layouts that hold ghost copies (GraphPlug's extended layouts)
_EXTENDED: set = set()


def note_extended(mesh, owned: tuple, extended: tuple) -> None:
    """Record a layout whose rows include ghost copies, so statistics over its rows (batch
    norm in training) are refused instead of counting the ghosts. GraphPlug calls it."""
    if tuple(owned) != tuple(extended):
        if len(_EXTENDED) > 4096:
            _EXTENDED.clear()
        _EXTENDED.add((mesh, tuple(extended)))


def _no_ghost_stats(prev, training_pos: int | None):
    def run(func, args, kwargs):
        x = args[0]
        training = True if training_pos is None else args[training_pos]
        if training and _rows1d(x) and x.ndim >= 1 and \
                (x._spec.mesh, tuple(x._spec.sizes[0])) in _EXTENDED:
            msg = (
                f"{func}: batch statistics over the rows of a graph's extended layout (owned "
                f"rows then ghost copies, sizes {tuple(x._spec.sizes[0])}) would count the "
                "ghost rows as well, so they would differ from one process. Normalise the "
                "owned rows (plug.end(h)), or use a per-node norm (LayerNorm over features) "
                "or none inside message-passing layers (e.g. GENConv(norm=None))"
            )
            raise ValueError(msg)
        return _call(prev, func, args, kwargs)

    return run


for _op, _pos in ((aten.native_batch_norm.default, 5),
                  (aten._native_batch_norm_legit.default, 5),
                  (aten._native_batch_norm_legit.no_stats, 3),
                  (aten._native_batch_norm_legit_functional.default, 5)):
    _base = rule_for(_op).fn  # grid_norm.py's
    register_rule(_op, direct=True, extends=_base)(_no_ghost_stats(_base, _pos))
