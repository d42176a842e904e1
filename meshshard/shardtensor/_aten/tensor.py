"""A ShardTensor whose autograd lives on the wrapper, dispatched at aten level.

``ShardTensor`` is a wrapper subclass like torch's DTensor: ``requires_grad``, ``grad_fn``
and ``.grad`` are the wrapper's own, autograd records the *global* computation, and every aten
op (forward and backward alike) reaches :func:`meshshard.shardtensor._aten.dispatch.dispatch`,
which computes on the local pieces. Unlike DTensor the spec records every rank's size of each
sharded dim (uneven and empty shards).

Tracing: ``__tensor_flatten__`` exposes the local piece and, per sharded mesh dim, a *size
carrier*: a zero-byte tensor (a 0-d tensor expanded, stride 0) whose shape is that dim's sizes on
every rank. Under ``torch.compile`` with dynamic shapes the carrier's dims are symbolic, so the
per-rank sizes travel through the graph as SymInts instead of being baked into the graph's
context: a new point count or split reuses the compiled graph.

Plain tensors that need a gradient (model weights) meet ShardTensors through a differentiable
lift (:class:`_Lift`) in ``__torch_function__``: forward treats them as Replicate, backward turns
the gradient (Partial or Replicate) back into a plain, full tensor. So a weight's ``.grad`` is a
plain tensor equal to the single-device gradient, with no hook and no patch.

Length (~600 lines): the class, its tracing protocol (carriers, flatten/unflatten), the lift of
plain tensors and the autograd Functions between local pieces and wrappers are one contract:
each relies on the others' layout record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from meshshard.shardtensor._aten import grad_bucket
from meshshard.shardtensor._aten._torch_private import (
    definitely_less,
    is_contiguous_or_false,
    is_custom_op_autograd_function,
    skip_dynamo_frame,
)
from meshshard.shardtensor._aten.collective_ops import (
    _AC_PENDING,
    keep_checkpointed_collectives_saved,
)
from meshshard.shardtensor._aten.no_rule import NoRuleError
from meshshard.shardtensor._aten.registry import FUNCTION_RULES

__all__ = ["ASpec", "Blocked", "ShardTensor", "wrap_local"]


@dataclass(frozen=True)
class Blocked:
    """Tensor dim ``dim`` is ``blocks`` repetitions of a sharded coordinate: rank r holds, in
    every block, that coordinate's rows ``[offset_r, offset_r + size_r)`` (block-major). This is
    what flattening a sharded dim with the dims before it gives (``(B, H, N, D) -> (B*H*N, D)``
    in a linear layer over a head-split tensor): the rows stay local, so the layer does.
    ``Shard(d)`` is the case ``blocks == 1``."""

    dim: int
    blocks: int

    def __str__(self) -> str:
        return f"B({self.dim}x{self.blocks})"


SHARDED = (Shard, Blocked)


def shard_like(p, dim: int, blocks: int | None = None):
    """``p`` (Shard or Blocked) moved to ``dim`` (optionally with new ``blocks``)."""
    b = getattr(p, "blocks", 1) if blocks is None else blocks
    return Shard(dim) if b == 1 else Blocked(dim, b)


class ASpec:
    """Mesh, placements, global shape and per-rank sizes of each Shard placement (interned)."""

    __slots__ = ("__weakref__", "mesh", "placements", "shape", "sizes")

    def __init__(self, mesh, placements: tuple, sizes: tuple, shape: tuple) -> None:
        self.mesh = mesh
        self.placements = placements
        self.sizes = sizes  # per mesh dim: tuple of per-rank sizes (ints or SymInts) or None
        self.shape = shape

    def key(self) -> tuple:
        return (id(self.mesh), self.placements, self.sizes, self.shape)

    def __repr__(self) -> str:
        parts = [
            f"{p}{list(s) if s is not None else ''}" for p, s in zip(self.placements, self.sizes)
        ]
        return f"[{', '.join(parts)}] global {tuple(self.shape)}"


try:
    from torch._C._functorch import peek_interpreter_stack as _peek_functorch
except ImportError:  # pragma: no cover - torch without functorch

    def _peek_functorch():
        return None


_CARRIER_PAD = 2


def _carrier_names(spec: ASpec) -> list[str]:
    return [f"_sz{i}_{r}" for i, s in enumerate(spec.sizes) if s is not None
            for r in range(len(s))]


def _global_strides(local: torch.Tensor, shape: tuple) -> tuple:
    """Contiguous strides of the global ``shape`` in the dim order of ``local``'s memory."""
    st = local.stride()
    order: list[int] = []  # outermost first; ties (size-1 dims) keep dim order
    for d in range(len(shape)):  # insertion sort: symbolic strides compare without guards
        k = len(order)
        while k and definitely_less(st[order[k - 1]], st[d]):
            k -= 1
        order.insert(k, d)
    out = [0] * len(shape)
    acc = 1
    for d in reversed(order):
        out[d] = acc
        acc = acc * shape[d]
    return tuple(out)


# Functions of the modules above this one (the rules, the layout changes), which import this
# module: each sets its entries at import (``meshshard.shardtensor._aten`` imports them all), so
# the class reaches them without importing upward.
LATE: dict = {}


def _late(name: str) -> Any:
    fn = LATE.get(name)
    if fn is None:
        msg = (f"ShardTensor needs {name!r} from its rules; import meshshard.shardtensor "
               "(not meshshard.shardtensor._aten.tensor alone)")
        raise RuntimeError(msg)
    return fn
_EMPTY: dict = {}
_SPECS: dict = {}


def make_spec(mesh, placements: tuple, sizes: tuple, shape: tuple) -> ASpec:
    shape = tuple(shape)
    key = (id(mesh), placements, sizes, shape)
    try:
        hit = _SPECS.get(key)
    except TypeError:  # SymInts while tracing: not hashable, nothing to share
        return ASpec(mesh, placements, sizes, shape)
    if hit is None or hit.mesh is not mesh:
        if len(_SPECS) > 4096:
            _SPECS.clear()
        hit = _SPECS[key] = ASpec(mesh, placements, sizes, shape)
    return hit


class ShardTensor(torch.Tensor):
    _local: torch.Tensor
    _spec: ASpec

    @staticmethod
    def __new__(cls, local: torch.Tensor, spec: ASpec, requires_grad: bool = False):
        if is_contiguous_or_false(local):
            r = torch.Tensor._make_wrapper_subclass(
                cls, spec.shape, dtype=local.dtype, device=local.device,
                requires_grad=requires_grad,
            )
        else:  # claim the local piece's memory order (a permuted view stays one), so tracing
            # does not copy every tangent to match contiguous outer strides
            r = torch.Tensor._make_wrapper_subclass(
                cls, spec.shape, strides=_global_strides(local, spec.shape), dtype=local.dtype,
                device=local.device, requires_grad=requires_grad,
            )
        r._local = local
        r._spec = spec
        if type(local) is not torch.Tensor:  # tracing (fake/functional): carriers now, in mode
            for name in _carrier_names(spec):
                getattr(r, name)
        return r

    # ---------------------------------------------------------------- tracing
    # One carrier per rank and sharded mesh dim: a 0-d byte expanded to (size,). One carrier of
    # shape (n_0, n_1, ...) was tried first; AOTAutograd copied it (n_0 * n_1 bytes, 2.5 GB at
    # 45k x 55k points). A 1-d carrier costs at most its size in bytes if copied.
    def __tensor_flatten__(self):
        return ["_local", *_carrier_names(self._spec)], (self._spec.mesh, self._spec.placements)

    def __getattr__(self, name: str) -> Any:
        # made on first use (only tracing flattens), one per wrapper: dynamo refuses one
        # inner tensor shared by two inputs
        if name.startswith("_sz"):
            i, r = (int(v) for v in name[3:].split("_"))
            local = self.__dict__["_local"]
            c = local.new_empty((), dtype=torch.uint8).expand(self._spec.sizes[i][r] + _CARRIER_PAD)
            self.__dict__[name] = c
            return c
        raise AttributeError(name)

    @staticmethod
    def __tensor_unflatten__(inner: dict, ctx: tuple, outer_size, outer_stride):
        mesh, placements = ctx
        sizes = tuple(
            tuple(inner[f"_sz{i}_{r}"].shape[0] - _CARRIER_PAD for r in range(mesh.size(i)))
            if isinstance(p, SHARDED) else None
            for i, p in enumerate(placements)
        )
        for p, sz in zip(placements, sizes):
            if isinstance(p, Shard) and not isinstance(outer_size[p.dim], int):
                # one set of symbols under tracing: the global size is the sizes' sum (else
                # ``N // sum(sizes)`` stays opaque and every size test guards on it)
                torch._check(sum(sz) == outer_size[p.dim])
        spec = make_spec(mesh, placements, sizes, tuple(outer_size))
        out = ShardTensor(inner["_local"], spec, requires_grad=False)
        for name, c in inner.items():
            if name != "_local":
                out.__dict__[name] = c
        out.__dict__["_from_graph"] = True  # what a compiled graph returns (see _KeepLayout)
        return out

    # ---------------------------------------------------------------- dispatch
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _peek_functorch() is not None:
            msg = (
                f"{getattr(func, '__name__', func)} on a ShardTensor inside a torch.func "
                "transform (grad, vjp, vmap, jacrev): torch's functorch levels do not compose "
                "with this wrapper subclass (its dispatch sees level-wrapped pieces), so the "
                "result would be wrong. Use torch.autograd.grad(..., create_graph=True) for "
                "gradients of any order, or run the transform on plain tensors"
            )
            raise NotImplementedError(msg)
        entry = _ENGINE_ENTRIES.get(func)
        if entry is not None:
            # the backward pass must run with torch-function handling on: recomputations in it
            # (reentrant checkpointing) and custom backward formulas meet plain weights too
            return entry(*args, **kwargs)
        if not torch.compiler.is_compiling() and torch.is_grad_enabled():
            # compiled graphs' outputs, each through an identity that keeps its gradient's layout
            args, kwargs = _late("keep_compiled_layouts")(func, args, kwargs)
        fn = FUNCTION_RULES.get(func)
        if fn is not None:  # a rule at function level (ring attention, fused linear, ...):
            out = fn(*args, **kwargs)  # it lifts plain tensors itself where it needs to
            if out is not NotImplemented:
                return out
        if torch.is_grad_enabled() and not _is_custom_op_autograd(func):
            args, kwargs = _lift_plain(args, kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            try:
                return func(*args, **kwargs)
            except NoRuleError as e:  # name the torch function the aten op came from
                raise e.within(func) from None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if _AC_PENDING:  # (only while a checkpointed region is traced)
            keep_checkpointed_collectives_saved()
        dispatch = LATE.get("dispatch") or _late("dispatch")
        return dispatch(func, args, kwargs or _EMPTY)

    # ---------------------------------------------------------------- layout
    @property
    def placements(self) -> tuple:
        return self._spec.placements

    @property
    def device_mesh(self):
        return self._spec.mesh

    def to_local(self) -> torch.Tensor:
        """This rank's piece, differentiable (gradients come back as the local gradient)."""
        return _ToLocal.apply(self)

    def full_tensor(self) -> torch.Tensor:
        """The global tensor on every rank (differentiable). Collective."""
        return _Full.apply(self)

    def redistribute(self, placements=None, sizes=None) -> ShardTensor:
        """This tensor in another layout (see :func:`..layout.redistribute`). Collective."""
        return _late("redistribute")(self, placements, sizes)

    def sharding_sizes(self, mesh_dim: int = 0) -> tuple:
        """Each rank's size of the tensor dim sharded by ``mesh_dim`` (uneven, zeros allowed)."""
        s = self._spec.sizes[mesh_dim]
        if s is None:
            msg = f"mesh dim {mesh_dim} is {self._spec.placements[mesh_dim]}, not Shard"
            raise ValueError(msg)
        return s

    def __format__(self, spec: str) -> str:
        """A one-element tensor formats as its value (a Partial one is reduced first:
        collective, like ``item()``); anything else as its repr."""
        if self.numel() == 1:
            return self.item().__format__(spec)
        return repr(self)

    def _stable_hash_for_caching(self) -> str:
        """AOT autograd's cache key of this wrapper: mesh (device type, ranks, dim names),
        placements, global shape and the local piece's metadata (the per-rank sizes are the
        carrier tensors' shapes, part of the same key). The mesh object does not pickle."""
        import hashlib

        mesh = self._spec.mesh
        loc = self._local
        key = (type(self).__qualname__, mesh.device_type, tuple(mesh.mesh.flatten().tolist()),
               tuple(mesh.mesh.shape), mesh.mesh_dim_names, tuple(map(str, self._spec.placements)),
               tuple(map(str, self._spec.shape)), tuple(map(str, self._spec.sizes)),
               self.requires_grad, str(loc.dtype), tuple(map(str, loc.shape)),
               tuple(map(str, loc.stride())), loc.device.type)
        return hashlib.sha256(repr(key).encode()).hexdigest()

    @property
    def spec(self) -> ASpec:
        """The layout record: mesh, placements, global shape and, per mesh dim, every rank's
        sizes of the tensor dim it shards (None for Replicate/Partial)."""
        return self._spec

    def sharding_shapes(self) -> dict:
        """mesh dim -> the local shape on every coordinate of that mesh dim (others fixed at
        this rank's coordinate)."""
        out = {}
        for i, s in enumerate(self._spec.sizes):
            if s is None:
                continue
            shapes = []
            for c in range(len(s)):
                shape = list(self._local.shape)
                p = self._spec.placements[i]
                shape[p.dim] = s[c] * getattr(p, "blocks", 1)
                shapes.append(torch.Size(shape))
            out[i] = tuple(shapes)
        return out

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        """A gradient reaching a compiled graph's backward in another layout than traced
        (e.g. Partial from an eager region after a graph break) is redistributed to it."""
        if expected_type is not None and expected_type is not type(self):
            return None
        mesh, placements = expected_metadata
        if mesh is not self._spec.mesh and mesh != self._spec.mesh:
            return None
        if tuple(placements) == self._spec.placements:
            return self
        if any(isinstance(p, SHARDED) and p != q
               for p, q in zip(placements, self._spec.placements)):
            return None  # the traced per-rank sizes are not in the metadata: torch's error
        sizes = [s if p == q else None
                 for p, q, s in zip(placements, self._spec.placements, self._spec.sizes)]
        return self.redistribute(tuple(placements), sizes)

    def __repr__(self) -> str:  # type: ignore[override]
        return f"ShardTensor(local={tuple(self._local.shape)}, {self._spec})"


# ------------------------------------------------------------------ lifting plain tensors
def _lift_plain(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    mesh = None
    for a in args:
        if type(a) is ShardTensor:
            mesh = a._spec.mesh
            break
    if mesh is None:
        for a in args:
            if isinstance(a, (list, tuple)):
                for b in a:
                    if type(b) is ShardTensor:
                        mesh = b._spec.mesh
                        break
    if mesh is None:
        return args, kwargs
    need = False
    for a in args:
        if _plain_needing_grad(a):
            need = True
            break
    else:
        for a in kwargs.values():
            if _plain_needing_grad(a):
                need = True
                break
    if not need:
        return args, kwargs
    pos = [k for k, a in enumerate(args) if _plain_needing_grad(a)]
    names = [k for k, a in kwargs.items() if _plain_needing_grad(a)]
    plain = [args[k] for k in pos] + [kwargs[k] for k in names]
    # one lift for all of the call's weights (a layer norm's weight and bias): their gradients
    # are reduced in one collective
    lifted = (_Lift.apply(plain[0], mesh),) if len(plain) == 1 else _LiftMany.apply(mesh, *plain)
    out = list(args)
    for k, v in zip(pos, lifted):
        out[k] = v
    kw = dict(kwargs)
    for k, v in zip(names, lifted[len(pos):]):
        kw[k] = v
    return tuple(out), kw


# the engine entries (``backward``, ``autograd.grad``): :mod:`.engine` fills this
_ENGINE_ENTRIES: dict = {}


def _is_custom_op_autograd(func: Any) -> bool:
    """Our custom ops, and the autograd.Function that ``torch.library.custom_op`` runs for a
    registered autograd formula: their plain arguments (weights) are the op's own business, so
    they are not lifted (our fused ops return plain gradients themselves)."""
    if str(getattr(func, "_qualified_op_name", "")).startswith("meshshard::") or \
            getattr(func, "namespace", None) == "meshshard":
        return True  # our custom ops (called on wrappers) take plain weights as they are
    return is_custom_op_autograd_function(getattr(func, "__self__", None))


def _skip_new_in_dynamo() -> None:
    skip_dynamo_frame(ShardTensor.__new__)


_skip_new_in_dynamo()


def _plain_needing_grad(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and type(a) is not ShardTensor and a.requires_grad


def replicate_spec(mesh, shape) -> ASpec:
    return make_spec(mesh, (Replicate(),) * mesh.ndim, (None,) * mesh.ndim, tuple(shape))


class _Lift(torch.autograd.Function):
    """Plain tensor -> Replicate ShardTensor; backward: the full gradient as a plain tensor."""

    @staticmethod
    def forward(x: torch.Tensor, mesh) -> ShardTensor:
        return ShardTensor(x.detach(), replicate_spec(mesh, x.shape))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # functorch needs it split out
        ctx.src = id(inputs[0])  # (the id only: a traced backward's bucket finds it by id)

    @staticmethod
    def backward(ctx, g):
        if isinstance(g, ShardTensor):
            if grad_bucket.takes(ctx.src) and not torch.is_grad_enabled():
                key = _bucket_key(g)  # (asked only where a bucket is open: eager skips it)
                if key is not None and grad_bucket.defer(ctx.src, g._local, key):
                    return None, None
            return _Full.apply(g), None
        return g, None


class _LiftMany(torch.autograd.Function):
    """Several plain tensors -> Replicate ShardTensors; backward: their full gradients as plain
    tensors, the Partial ones summed in one collective (flattened together)."""

    @staticmethod
    def forward(mesh, *xs: torch.Tensor) -> tuple:
        return tuple(ShardTensor(x.detach(), replicate_spec(mesh, x.shape)) for x in xs)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.srcs = tuple(id(x) for x in inputs[1:])

    @staticmethod
    def backward(ctx, *gs):
        return (None, *full_plain_grads(gs, ctx.srcs))


def _bucket_key(g: Any) -> tuple | None:
    """(mesh, dtype, Partial mesh dims) of a gradient whose Partial dims one flattened
    all-reduce completes (sum Partials, the rest Replicate); None for any other."""
    if type(g) is not ShardTensor:
        return None
    dims = []
    for i, p in enumerate(g._spec.placements):
        if isinstance(p, Partial) and p.reduce_op == "sum":
            dims.append(i)
        elif not isinstance(p, Replicate):
            return None
    return (g._spec.mesh, g.dtype, tuple(dims)) if dims else None


def full_plain_grads(gs: tuple, srcs: tuple = ()) -> list:
    """The plain full tensors of the gradients ``gs`` (ShardTensors, plain tensors or None).
    Sum Partials that share a mesh and dtype are reduced in one flattened collective (or
    handed to an open :mod:`.grad_bucket` by their source's id in ``srcs``: None here);
    with ``create_graph`` each goes through :class:`_Full` (differentiable). Collective."""
    out = [g if type(g) is not ShardTensor else None for g in gs]
    groups: dict = {}
    for k, g in enumerate(gs):
        if type(g) is not ShardTensor:
            continue
        key = None if torch.is_grad_enabled() else _bucket_key(g)
        if key is not None and srcs and grad_bucket.defer(srcs[k], g._local, key):
            continue
        if key is None:
            out[k] = _Full.apply(g)
        else:
            groups.setdefault(key, []).append(k)
    for (mesh, _, dims), ks in groups.items():
        summed = reduce_flattened([gs[k]._local for k in ks], mesh, dims)
        for k, t in zip(ks, summed):
            out[k] = t
    return out


def reduce_flattened(pieces: list, mesh, dims: Any) -> list:
    """``pieces`` (local tensors of one dtype) each summed over the mesh dims ``dims``, in one
    collective per dim: flattened, concatenated, summed, split back to their shapes."""
    flat = pieces[0].reshape(-1) if len(pieces) == 1 else torch.cat([t.reshape(-1) for t in pieces])
    for i in dims:
        flat = _late("all_reduce")(flat, mesh, i)
    out, off = [], 0
    for t in pieces:
        out.append(flat[off:off + t.numel()].view(t.shape))
        off += t.numel()
    return out


# The backwards below are made of these same functions, so they are differentiable again
# (double backward through to_local / full_tensor / from_local).
class _ToLocal(torch.autograd.Function):
    @staticmethod
    def forward(x: ShardTensor) -> torch.Tensor:
        return x._local.view_as(x._local)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.spec = inputs[0]._spec

    @staticmethod
    def backward(ctx, g):
        return _FromLocal.apply(g, ctx.spec)


class _Full(torch.autograd.Function):
    @staticmethod
    def forward(x: ShardTensor) -> torch.Tensor:
        return _late("to_replicate_local")(x._local, x._spec)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.spec = inputs[0]._spec

    @staticmethod
    def backward(ctx, g):
        spec = ctx.spec  # every rank holds the same full gradient: cut this rank's piece
        return _late("grad_in_layout")(_FromLocal.apply(g, replicate_spec(spec.mesh, spec.shape)),
                                       spec)


def wrap_local(local: torch.Tensor, mesh, placements, sizes) -> ShardTensor:
    """Wrap this rank's piece (differentiable w.r.t. ``local``). ``sizes``: per mesh dim, the
    per-rank sizes of each Shard placement (None for others). No collective."""
    placements = tuple(placements)
    shape = list(local.shape)
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            shape[p.dim] = sum(sizes[i])
        elif isinstance(p, Partial) and p.reduce_op != "sum":
            msg = f"a ShardTensor's Partial placements reduce by 'sum' only, got {p}"
            raise NotImplementedError(msg)
    sizes = tuple(None if s is None else tuple(int(v) for v in s) for s in sizes)
    spec = make_spec(mesh, placements, sizes, tuple(shape))
    return _FromLocal.apply(local, spec)


class _FromLocal(torch.autograd.Function):
    @staticmethod
    def forward(local: torch.Tensor, spec: ASpec) -> ShardTensor:
        return ShardTensor(local.detach(), spec)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.spec = inputs[1]

    @staticmethod
    def backward(ctx, g):
        if not isinstance(g, ShardTensor):
            if any(s is not None for s in ctx.spec.sizes):
                msg = (
                    "a custom autograd.Function's backward (or a grad_outputs) returned a plain "
                    "tensor as the gradient of a sharded ShardTensor input (global shape "
                    f"{tuple(ctx.spec.shape)}); return a ShardTensor there, e.g. computed from "
                    "the incoming gradient or made with from_local"
                )
                raise TypeError(msg)
            return g, None
        # the gradient may arrive in another layout (e.g. Replicate from an expand)
        return _ToLocal.apply(_late("grad_in_layout")(g, ctx.spec)), None
