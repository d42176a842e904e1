"""ShardTensor: an uneven domain-parallel tensor on a torch DeviceMesh.

A ShardTensor *presents* the global tensor (its ``shape`` is global) and *holds* this rank's
local piece plus a :class:`~meshshard.shardtensor.spec.ShardSpec` that records every rank's size
of every sharded dim. Torch functions called on it are routed (``__torch_function__``) to
sharding rules that compute on local pieces with ordinary, differentiable torch ops and
autograd-aware collectives; autograd therefore runs on the local tensors, forward and backward,
and no code path assumes ``torch.chunk`` sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from meshshard.collective_check import check_collective
from meshshard.shardtensor.spec import ShardSpec, normalize_placements

__all__ = ["ShardTensor", "from_local", "scatter"]


def _torch_function(cls, func, types, args=(), kwargs=None):
    """Every torch function on a ShardTensor runs here, opaque to torch.compile.

    The sharding rules are Python (registries, caches, collectives) that dynamo cannot trace
    (it failed with "SymNodeVariable() is not a constant"). So this function is a dynamo
    ``disable`` boundary, built without importing torch._dynamo (2+ s): dynamo sees
    ``_torchdynamo_disable`` and graph-breaks instead of inlining, the function's own frame is
    marked SKIP, and the eval-frame callback is off while the rule runs (so no frame inside it is
    compiled). Under ``torch.compile`` every op on a ShardTensor is therefore one graph break
    and runs exactly as in eager mode; compile the local work between collectives with
    :func:`meshshard.shardtensor.compile.compile_local`.
    """
    dispatch = _DISPATCH[0]
    if dispatch is None:  # imported once, not per op (an import statement costs ~1 us a call)
        from meshshard.shardtensor import _dispatch

        dispatch = _DISPATCH[0] = _dispatch.dispatch_function
    prior = _set_eval_frame(None)
    try:
        return dispatch(func, types, args, kwargs or {})
    finally:
        _set_eval_frame(prior)


_DISPATCH: list = [None]
_BRIDGE = [False]


def _install_bridge() -> None:
    """Custom autograd Functions on ShardTensors need ``torch.autograd.Function.apply`` routed
    through a bridge (see ``autograd_function``). It is installed when the first ShardTensor is
    made, not on import: importing meshshard changes nothing in torch."""
    from meshshard.shardtensor.autograd_function import install

    install()
    _BRIDGE[0] = True


def _make_dynamo_opaque(fn: Any) -> None:
    fn._torchdynamo_disable = True  # dynamo: graph-break here, never inline
    fn._torchdynamo_disable_msg = "ShardTensor sharding rules run eagerly (meshshard)"
    fn._torchdynamo_disable_recursive = True
    try:  # the frame itself is never handed to dynamo (as torch._dynamo.skip_code does)
        from torch._C._dynamo import eval_frame as ef

        ef.set_code_exec_strategy(
            fn.__code__, ef._FrameExecStrategy(ef._FrameAction.SKIP, ef._FrameAction.DEFAULT)
        )
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - other torch builds
        pass


try:
    from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame
except ImportError:  # pragma: no cover - torch without dynamo

    def _set_eval_frame(callback: Any) -> Any:
        return None


_make_dynamo_opaque(_torch_function)


def dynamo_opaque(impl: Any) -> Any:
    """``impl`` behind the same dynamo boundary as ``__torch_function__``: an enclosing
    ``torch.compile`` graph-breaks at the call, and no frame below it is traced (it runs as in
    eager mode, or compiles itself)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        prior = _set_eval_frame(None)
        try:
            return impl(*args, **kwargs)
        finally:
            _set_eval_frame(prior)

    _make_dynamo_opaque(run)
    return run



class ShardTensor(torch.Tensor):
    """A torch.Tensor subclass holding one rank's piece of a global tensor.

    Use :func:`from_local` or :func:`scatter` to make one. ``shape`` is global;
    :meth:`to_local` gives this rank's piece; :attr:`placements`, :meth:`sharding_sizes` describe
    the layout.
    """

    _local: torch.Tensor
    _spec: ShardSpec

    @staticmethod
    def __new__(cls, local: torch.Tensor, spec: ShardSpec) -> ShardTensor:
        if not _BRIDGE[0]:
            _install_bridge()
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            spec.shape,
            dtype=local.dtype,
            device=local.device,
            requires_grad=False,
        )
        r._local = local
        r._spec = spec
        return r

    # ------------------------------------------------------------------ dispatch
    # every torch function on a ShardTensor: the sharding rules, opaque to torch.compile
    __torch_function__ = classmethod(_torch_function)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        msg = (
            f"aten op {func} reached a ShardTensor below autograd; ShardTensor computes through "
            "its torch-function rules. This usually means torch function handling was disabled "
            "around a call; call the op on ShardTensors normally."
        )
        raise RuntimeError(msg)

    # ------------------------------------------------------------------ autograd view
    @property
    def requires_grad(self) -> bool:  # type: ignore[override]
        return self._local.requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._local.requires_grad = value

    @property
    def grad(self) -> ShardTensor | None:  # type: ignore[override]
        g = self._local.grad
        return None if g is None else ShardTensor(g, self._spec)

    @grad.setter
    def grad(self, value: Any) -> None:
        self._local.grad = None if value is None else _local_of(value, self._spec)

    @property
    def is_leaf(self) -> bool:  # type: ignore[override]
        return self._local.is_leaf

    @property
    def grad_fn(self):  # type: ignore[override]
        return self._local.grad_fn

    # ------------------------------------------------------------------ layout
    @property
    def placements(self) -> tuple[Placement, ...]:
        return self._spec.placements

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._spec.mesh

    @property
    def spec(self) -> ShardSpec:
        return self._spec

    def sharding_sizes(self, mesh_dim: int = 0) -> tuple[int, ...]:
        """Each rank's size of the tensor dim sharded by ``mesh_dim`` (uneven, zeros allowed)."""
        s = self._spec.sizes[mesh_dim]
        if s is None:
            msg = f"mesh dim {mesh_dim} is {self._spec.placements[mesh_dim]}, not Shard"
            raise ValueError(msg)
        return s

    def sharding_shapes(self) -> dict[int, tuple[torch.Size, ...]]:
        """mesh dim -> the local shape on every coordinate of that mesh dim (others fixed at
        this rank's coordinate)."""
        coord = self._spec.coordinate()
        out = {}
        for i, s in enumerate(self._spec.sizes):
            if s is None:
                continue
            shapes = []
            for c in range(len(s)):
                cc = list(coord)
                cc[i] = c
                shapes.append(self._spec.local_shape(cc))
            out[i] = tuple(shapes)
        return out

    def to_local(self) -> torch.Tensor:
        """This rank's piece (differentiable: it *is* the tensor autograd tracks)."""
        return self._local

    def full_tensor(self) -> torch.Tensor:
        """The global tensor on every rank (differentiable). Collective."""
        from meshshard.shardtensor.redistribute import redistribute_local

        local = redistribute_local(self._local, self._spec, [Replicate()] * self._spec.mesh.ndim)
        return local

    def redistribute(
        self,
        placements: Sequence[Placement] | None = None,
        sizes: Sequence[Sequence[int] | None] | Sequence[int] | None = None,
    ) -> ShardTensor:
        """Change the layout: Shard <-> Replicate <-> Partial, or a new uneven split.

        ``sizes`` (per mesh dim, or a flat list for a 1-D mesh) chooses the target sizes of each
        Shard placement — e.g. to rebalance to a caller-chosen layout; ``None`` keeps the
        current sizes for an unchanged Shard dim and uses balanced sizes otherwise.
        Differentiable. Collective.
        """
        from meshshard.shardtensor.redistribute import redistribute

        return redistribute(self, placements, sizes)

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:  # type: ignore[override]
        return (
            f"ShardTensor(local={tuple(self._local.shape)}, {self._spec.describe()}, "
            f"dtype={self.dtype}, device={self._local.device})"
        )

    __str__ = __repr__

    def __reduce_ex__(self, protocol):
        msg = "a ShardTensor cannot be pickled; save .to_local() and its sharding sizes instead"
        raise TypeError(msg)

    def __deepcopy__(self, memo):
        return ShardTensor(self._local.clone(), self._spec)


def _local_of(value: Any, spec: ShardSpec) -> torch.Tensor:
    if isinstance(value, ShardTensor):
        if value._spec != spec:
            from meshshard.shardtensor.redistribute import redistribute_local

            return redistribute_local(value._local, value._spec, spec.placements, spec.sizes)
        return value._local
    return value


def _parse_sizes(
    sharding_shapes: Any, placements: tuple, mesh: DeviceMesh, ndim: int
) -> list[tuple[int, ...] | None] | None:
    """Every rank's size of each sharded dim, from any of the accepted forms:

    - a flat list of sizes (one Shard placement): ``[3, 5]``;
    - a list per mesh dim (``None`` for non-Shard dims): ``[[3, 5]]``, ``[None, [2, 6]]``;
    - a dict ``{mesh_dim: sizes or per-rank shapes}`` (PhysicsNeMo's form):
      ``{0: (torch.Size([3, 4]), torch.Size([5, 4]))}``;
    - on a 1-D mesh, a list of per-rank shapes: ``[torch.Size([3, 4]), torch.Size([5, 4])]``.

    Anything else raises a ValueError that says which form was expected.
    """
    if sharding_shapes is None:
        return None
    shard_dims = [i for i, p in enumerate(placements) if isinstance(p, Shard)]
    forms = (
        "give a flat list of sizes ([3, 5]), a list per mesh dim ([[3, 5]]), a dict "
        "{mesh_dim: sizes or per-rank shapes}, or on a 1-D mesh a list of per-rank shapes"
    )
    if isinstance(sharding_shapes, dict):
        items = dict(sharding_shapes)
    elif isinstance(sharding_shapes, (list, tuple)):
        seq = list(sharding_shapes)
        if seq and all(_is_int(v) for v in seq):
            if len(shard_dims) != 1:
                msg = (
                    "a flat list of sharding sizes needs exactly one Shard placement; give a "
                    "dict {mesh_dim: sizes} instead"
                )
                raise ValueError(msg)
            items = {shard_dims[0]: seq}
        elif (mesh.ndim == 1 and len(seq) == mesh.size(0) and shard_dims == [0]
              and all(_is_shape(v, ndim) for v in seq)):
            # one local shape per rank (PhysicsNeMo's list form); the per-mesh-dim form would
            # have one entry, so the two agree where they coincide (one rank, 1-d tensor)
            items = {0: seq}
        else:
            if len(seq) != mesh.ndim:
                msg = (
                    f"sharding_shapes {sharding_shapes!r} has {len(seq)} entries for a "
                    f"{mesh.ndim}-d DeviceMesh of {tuple(mesh.shape)} ranks: {forms}"
                )
                raise ValueError(msg)
            items = {i: s for i, s in enumerate(seq) if s is not None}
    else:
        msg = f"sharding_shapes must be a list or a dict, got {type(sharding_shapes).__name__}"
        raise ValueError(msg)
    out: list[tuple[int, ...] | None] = [None] * mesh.ndim
    for i, s in items.items():
        if not _is_int(i) or not 0 <= int(i) < mesh.ndim:
            msg = f"sharding_shapes names mesh dim {i!r}; the DeviceMesh has {mesh.ndim} dim(s)"
            raise ValueError(msg)
        i = int(i)
        if i not in shard_dims:
            msg = f"sharding sizes given for mesh dim {i}, which is {placements[i]}, not Shard"
            raise ValueError(msg)
        d = placements[i].dim
        if isinstance(s, torch.Size) or not isinstance(s, (list, tuple)) or len(s) != mesh.size(i):
            msg = (
                f"sharding_shapes for mesh dim {i} must hold one size or local shape per rank "
                f"({mesh.size(i)} of them), got {s!r}: {forms}"
            )
            raise ValueError(msg)
        vals = []
        for v in s:
            if _is_shape(v, ndim):
                v = v[d]
            if not _is_int(v) or int(v) < 0:
                msg = (
                    f"sharding_shapes for mesh dim {i}: {v!r} is neither a size >= 0 nor a "
                    f"local shape of {ndim} dims: {forms}"
                )
                raise ValueError(msg)
            vals.append(int(v))
        out[i] = tuple(vals)
    for i in shard_dims:
        if out[i] is None:
            msg = f"sharding sizes missing for Shard placement on mesh dim {i}"
            raise ValueError(msg)
    return out


def _is_int(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (torch.is_tensor(v) and v.ndim == 0 and not
                                  v.is_floating_point())


def _is_shape(v: Any, ndim: int) -> bool:
    return isinstance(v, (torch.Size, tuple, list)) and len(v) == ndim and all(
        _is_int(k) for k in v)


def resolve_layout(
    local: torch.Tensor,
    mesh: DeviceMesh,
    placements: Sequence[Placement],
    sharding_shapes: Any = None,
    *,
    validate: bool = True,
) -> tuple[tuple, list, list]:
    """Placements, every rank's sizes of each sharded dim and the global shape of a tensor whose
    local piece on this rank is ``local`` (the checks of :func:`from_local`; collective as it
    says). Shared by every ShardTensor class, so they accept and refuse the same layouts."""
    placements = normalize_placements(placements, mesh, local.ndim)
    sizes = _parse_sizes(sharding_shapes, placements, mesh, local.ndim)
    coord = mesh.get_coordinate()
    if coord is None:
        msg = "this rank is not part of the DeviceMesh given to from_local"
        raise RuntimeError(msg)
    local_shape = tuple(local.shape)
    need_collective = sizes is None or validate
    need_collective = need_collective and any(isinstance(p, Shard) for p in placements)
    if need_collective:
        # one all-gather of local shapes along every sharded mesh dim
        shape_t = torch.tensor([local.ndim, *local_shape], dtype=torch.int64)
        shape_t = torch.cat([shape_t, torch.zeros(17 - shape_t.numel(), dtype=torch.int64)])
        shape_t = shape_t.to(_comm_device(mesh))
        problems = []
        inferred: list[tuple[int, ...] | None] = [None] * mesh.ndim
        for i, p in enumerate(placements):
            if not isinstance(p, Shard):
                continue
            n = mesh.size(i)
            # append a fingerprint of this rank's declared sizes so disagreeing declarations
            # are seen by every rank
            decl = -1
            if sizes is not None:
                decl = len(sizes[i]) + sum((k + 1) * 1_000_003 * int(v) for k, v in
                                           enumerate(sizes[i])) % (1 << 61)
            vec = torch.cat([shape_t, torch.tensor([decl], dtype=torch.int64,
                                                   device=shape_t.device)])
            bufs = [torch.empty_like(vec) for _ in range(n)]
            if n > 1:
                check_collective("all_gather", mesh.get_group(i), vec, detail="local shapes")
                dist.all_gather(bufs, vec, group=mesh.get_group(i))
            else:
                bufs = [vec]
            if len({int(b[-1]) for b in bufs}) > 1:
                problems.append(
                    f"ranks declared different sharding sizes on mesh dim {i} (this rank: "
                    f"{None if sizes is None else tuple(sizes[i])}); pass the same sizes on "
                    "every rank"
                )
            along = [tuple(b[1 : 1 + int(b[0])].tolist()) for b in bufs]
            for c, shp in enumerate(along):
                other = [v for k, v in enumerate(shp) if k != p.dim]
                mine = [v for k, v in enumerate(local_shape) if k != p.dim]
                if len(shp) != local.ndim or other != mine:
                    problems.append(
                        f"mesh dim {i} coordinate {c} has local shape {shp}, this rank "
                        f"{local_shape}: shapes may differ only in the sharded dim {p.dim}"
                    )
            got = tuple(s[p.dim] if len(s) > p.dim else -1 for s in along)
            inferred[i] = got
            if sizes is not None and tuple(sizes[i]) != got:
                problems.append(
                    f"declared sharding sizes {tuple(sizes[i])} on mesh dim {i} disagree with the "
                    f"actual local sizes {got} of tensor dim {p.dim}"
                )
        if problems:
            msg = "from_local: " + "; ".join(problems)
            raise ValueError(msg)
        sizes = inferred
    else:
        if sizes is None:
            sizes = [None] * mesh.ndim
        for i, p in enumerate(placements):
            if isinstance(p, Shard) and sizes[i][coord[i]] != local_shape[p.dim]:
                msg = (
                    f"from_local: declared size {sizes[i][coord[i]]} for this rank (mesh dim {i} "
                    f"coordinate {coord[i]}) disagrees with the local tensor's size "
                    f"{local_shape[p.dim]} along dim {p.dim}"
                )
                raise ValueError(msg)
    shape = list(local_shape)
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            shape[p.dim] = int(sum(sizes[i]))
    return placements, sizes, shape


def from_local(
    local: torch.Tensor,
    mesh: DeviceMesh,
    placements: Sequence[Placement],
    sharding_shapes: Any = None,
    *,
    validate: bool = True,
) -> ShardTensor:
    """Wrap this rank's piece as a ShardTensor (differentiable w.r.t. ``local``).

    Parameters
    ----------
    local : Tensor
        This rank's piece.
    mesh : DeviceMesh
        1-D or 2-D (e.g. ``("data", "domain")``).
    placements : sequence of Shard(d) / Replicate() / Partial(op), one per mesh dim.
    sharding_shapes : optional
        Each rank's size of every sharded dim: a flat list (1-D mesh), a list per mesh dim, or a
        dict ``{mesh_dim: sizes or local shapes}``. ``None`` infers them with one all-gather.
    validate : bool
        With given shapes, check them against every rank's actual local shape (one all-gather
        of shapes, so *every* rank raises on a mismatch instead of some hanging). With
        ``validate=False`` only this rank's shape is checked and no collective runs.

    Collective: every rank of the mesh must call this (unless ``validate=False`` with
    ``sharding_shapes`` given, or the placements are all Replicate/Partial).

    Raises
    ------
    ValueError
        Placements that do not match the mesh, sizes that disagree with the local tensors, or
        local shapes that disagree outside the sharded dims.
    """
    if isinstance(local, ShardTensor):
        msg = "from_local got a ShardTensor; pass its .to_local() or use .redistribute()"
        raise TypeError(msg)
    if not isinstance(local, torch.Tensor):
        msg = f"from_local needs a torch.Tensor, got {type(local).__name__}"
        raise TypeError(msg)
    placements, sizes, shape = resolve_layout(local, mesh, placements, sharding_shapes,
                                              validate=validate)
    spec = ShardSpec.make(mesh, placements, shape, sizes)
    return ShardTensor(local, spec)


def _comm_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def scatter(
    tensor: torch.Tensor | None,
    mesh: DeviceMesh,
    sizes: Sequence[int],
    *,
    src: int = 0,
    dim: int = 0,
    mesh_dim: int = 0,
) -> ShardTensor:
    """Split ``tensor`` held by mesh coordinate ``src`` into pieces of ``sizes`` along ``dim``
    and send piece ``r`` to coordinate ``r`` of ``mesh_dim`` (e.g. a Partition's sizes).

    Other ranks pass ``None`` (or anything; it is ignored). Differentiable: gradients flow
    back to ``src``. Collective over ``mesh_dim`` (shape and dtype are broadcast from ``src``).
    """
    from meshshard.shardtensor.collectives import all_to_all_v

    group = mesh.get_group(mesh_dim)
    n = mesh.size(mesh_dim)
    me = mesh.get_local_rank(mesh_dim)
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) != n or any(s < 0 for s in sizes):
        msg = f"scatter: sizes {sizes} must have {n} non-negative entries (one per rank)"
        raise ValueError(msg)
    # broadcast metadata so non-src ranks know the shape/dtype
    dev = _comm_device(mesh)
    meta = torch.zeros(18, dtype=torch.int64, device=dev)
    if me == src:
        if tensor is None:
            msg = "scatter: the src rank must pass the tensor"
            raise ValueError(msg)
        d = dim + tensor.ndim if dim < 0 else dim
        ok = int(sum(sizes) == tensor.shape[d])
        dt = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else -1
        meta[:3] = torch.tensor([ok, dt, tensor.ndim])
        meta[3 : 3 + tensor.ndim] = torch.tensor(tensor.shape)
    src_global = dist.get_global_rank(group, src) if n > 1 else dist.get_rank()
    if n > 1:
        check_collective("broadcast", group, meta, detail=f"scatter metadata from {src_global}")
        dist.broadcast(meta, src=src_global, group=group)
    ok, dt, ndim = (int(v) for v in meta[:3].tolist())
    shape = meta[3 : 3 + ndim].tolist()
    d = dim + ndim if dim < 0 else dim
    if not ok:
        msg = f"scatter: sizes sum to {sum(sizes)} but the tensor has {shape[d]} along dim {d}"
        raise ValueError(msg)
    if dt < 0:
        msg = "scatter: unsupported dtype"
        raise TypeError(msg)
    if me == src:
        x = tensor.movedim(d, 0)
        send = list(sizes)
    else:
        rest = [s for k, s in enumerate(shape) if k != d]
        x = torch.empty((0, *rest), dtype=_DTYPES[dt], device=dev)
        send = [0] * n
    recv = [0] * n
    recv[src] = sizes[me]
    local = all_to_all_v(x, send, recv, group).movedim(0, d)
    placements = [Replicate()] * mesh.ndim
    placements[mesh_dim] = Shard(d)
    spec_sizes: list[Any] = [None] * mesh.ndim
    spec_sizes[mesh_dim] = sizes
    spec = ShardSpec.make(mesh, placements, shape, spec_sizes)
    return ShardTensor(local, spec)


_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]
