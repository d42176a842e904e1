"""Compile a whole model on ShardTensor inputs: one graph per input layout, collectives inside.

``torch.compile(model)`` runs every op on a ShardTensor eagerly (the sharding rules are Python
that dynamo cannot trace, so each op is a graph break) and :func:`compile_local` compiles only
row-local blocks. :func:`compile_sharded` compiles everything, including the blocks that
communicate (e.g. Transolver's attention, whose reductions over points are all-reduces):

1. On the first call for an input layout (placements and every rank's sizes of each
   ShardTensor argument, shapes of plain arguments, parameters, train/eval, grad mode), the
   model's forward is traced with AOTAutograd on fake tensors. The sharding rules run once,
   here, in Python; the local ops they issue are recorded, and so are their collectives, which
   become functional collectives (graph nodes; see :mod:`._tracemode`). AOTAutograd also traces
   the backward, including the gradient all-reduces of replicated parameters, and splits the
   joint graph into a forward and a backward graph, which the backend compiles (inductor by
   default).
2. Every later call with that layout runs the compiled forward on the local pieces and wraps
   the outputs with the layouts recorded at trace time. No sharding rule and no per-op
   dispatch runs; the collectives run where the graph has them.

What cannot be traced is refused with :class:`NotTraceableError` on every rank (one small
all-reduce of the verdict): ring attention's point-to-point shifts, exchanges whose sizes
depend on the data (e.g. a cat whose row counts are only known at run time). Each rank traces
and compiles for its own local shapes; the collectives come in program order on every rank,
since the rules decide them from the global layout, which all ranks share.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from meshshard import collective_check
from meshshard.shardtensor._compile_check import all_ranks_ok
from meshshard.shardtensor._tracemode import (
    NotTraceableError,
    keep_collectives,
    tracing,
    tracing_collectives,
)
from meshshard.shardtensor.api import ShardTensor, dynamo_opaque

__all__ = ["BACKENDS", "NotTraceableError", "compile_sharded", "is_compiled_sharded"]

log = logging.getLogger(__name__)

BACKENDS = ("inductor", "aot_eager")
"""``"inductor"``: fused C++/Triton kernels (compiles for seconds per layout);
``"aot_eager"``: the traced aten graphs run op by op (no code generation; for tests)."""

_MAX_LAYOUTS = 8  # compiled layouts kept per model (least recently used dropped)


def compile_sharded(module: nn.Module, *, backend: str = "inductor") -> nn.Module:
    """Run ``module`` on ShardTensor inputs as one compiled graph per input layout.

    In place (``state_dict`` keys, parameters, optimizers and module hooks are unchanged);
    returns ``module``. Calls without ShardTensor arguments run the module's own forward.

    Parameters
    ----------
    module : nn.Module
        Any model whose forward the ShardTensor rules run (no edits needed). Its parameters and
        buffers are read afresh on every call, so optimizer steps, ``load_state_dict`` and
        wrappers that swap parameters are seen.
    backend : {"inductor", "aot_eager"}
        How the traced graphs run (see :data:`BACKENDS`).

    Returns
    -------
    nn.Module
        ``module`` itself.

    Raises
    ------
    NotTraceableError
        On every rank, on the first call for a layout, when the forward uses an op that cannot
        be part of a graph (ring attention, data-dependent exchanges); run that model eagerly.
    ValueError
        An unknown backend.

    Notes
    -----
    Results equal eager ShardTensor execution to float rounding (inductor fuses and reorders).
    Dropout draws the compiled graph's random numbers, not eager's. Non-tensor arguments are
    part of the layout key (they are constants of the graph), so they must be hashable. The
    first call for each layout traces and compiles (about a second with ``aot_eager``, tens of
    seconds with inductor on a small CPU host). A rank that fails to trace or compile (the
    forward on the first call, the backward on the first backward) tells the others, which
    raise too instead of waiting in a collective.

    Collective: a call on ShardTensor inputs runs the collectives of the model's forward (and
    backward); the first forward and backward per layout add one all-reduce of the verdict.

    Example
    -------
    >>> compile_sharded(model)                                  # doctest: +SKIP
    >>> out = model(coords, feats)             # ShardTensors in, ShardTensors out
    """
    if not isinstance(module, nn.Module):
        msg = f"compile_sharded needs an nn.Module, got {type(module).__name__}"
        raise TypeError(msg)
    if backend not in BACKENDS:
        msg = f"compile_sharded: backend={backend!r} is not one of {BACKENDS}"
        raise ValueError(msg)
    if is_compiled_sharded(module):
        module.forward.backend = backend
        return module
    module.forward = _ShardedForward(module, backend)
    return module


def is_compiled_sharded(module: nn.Module) -> bool:
    """Whether :func:`compile_sharded` was applied to ``module``."""
    return isinstance(module.__dict__.get("forward"), _ShardedForward)


class _ShardedForward:
    """The replacement ``forward`` (plain inputs: the module's own forward)."""

    def __init__(self, module: nn.Module, backend: str) -> None:
        self.orig = type(module).forward.__get__(module)
        self.module_ref = module
        self.backend = backend
        self.entries: OrderedDict = OrderedDict()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if tracing():  # inside another compile_sharded model's trace: trace through
            return self.orig(*args, **kwargs)
        leaves, treedef = tree_flatten((args, kwargs))
        if not any(isinstance(v, ShardTensor) for v in leaves):
            return self.orig(*args, **kwargs)
        return _run(self, leaves, treedef)

    def __deepcopy__(self, memo: dict) -> _ShardedForward:
        import copy

        return _ShardedForward(copy.deepcopy(self.module_ref, memo), self.backend)


def _run_impl(fwd: _ShardedForward, leaves: list, treedef: Any) -> Any:
    module = fwd.module_ref
    state = dict(module.named_parameters())
    state.update(module.named_buffers())
    tensors, kinds = _split(leaves)
    key = (
        treedef,
        tuple(kinds),
        tuple((n, t.shape, t.dtype, t.requires_grad) for n, t in state.items()),
        tuple((t.shape, t.dtype, t.device, t.requires_grad) for t in tensors),
        module.training,
        torch.is_grad_enabled(),
        fwd.backend,
    )
    try:
        entry = fwd.entries.get(key)
    except TypeError as exc:  # an unhashable constant argument
        msg = (
            f"compile_sharded({type(module).__name__}): non-tensor arguments must be hashable "
            f"(they are constants of the compiled graph): {exc}"
        )
        raise TypeError(msg) from None
    if entry is None:
        _refuse_fsdp_inside(module)
        entry = _Entry(fwd, treedef, tuple(kinds), tuple(state), _mesh_of(leaves))
        fwd.entries[key] = entry
        if len(fwd.entries) > _MAX_LAYOUTS:
            fwd.entries.popitem(last=False)
            log.warning("compile_sharded(%s): more than %d input layouts; recompiling the "
                        "least recently used ones", type(module).__name__, _MAX_LAYOUTS)
    else:
        fwd.entries.move_to_end(key)
    outs = entry(list(state.values()), tensors)
    otree, okinds = entry.out
    return tree_unflatten(_join(okinds, outs), otree)


_run = dynamo_opaque(_run_impl)  # opaque to an enclosing torch.compile


def _split(leaves: list) -> tuple[list, list]:
    """Leaves -> (tensors for the graph: ShardTensors' local pieces and plain tensors, and
    each leaf's kind: ("S", spec), ("T", None) or ("C", the constant itself))."""
    tensors, kinds = [], []
    for v in leaves:
        if isinstance(v, ShardTensor):
            tensors.append(v._local)
            kinds.append(("S", v._spec))
        elif isinstance(v, torch.Tensor):
            tensors.append(v)
            kinds.append(("T", None))
        else:
            kinds.append(("C", v))
    return tensors, kinds


def _join(kinds: list | tuple, tensors: list) -> list:
    """The inverse of :func:`_split`."""
    it = iter(tensors)
    return [ShardTensor(next(it), spec) if kind == "S" else next(it) if kind == "T" else spec
            for kind, spec in kinds]  # fmt: skip


def _refuse_fsdp_inside(module: nn.Module) -> None:
    """FSDP2's hooks on a wrapped submodule all-gather real weights inside the forward, which a
    trace on fake tensors cannot run. The root may be ``fully_shard``-ed (its hooks run
    outside the compiled forward); the same on every rank, so raising here hangs nobody."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return
    inner = [n for n, m in module.named_modules() if n and isinstance(m, FSDPModule)]
    if inner:
        msg = (
            f"compile_sharded({type(module).__name__}): submodules {inner[:4]} are wrapped by "
            "FSDP2 (fully_shard), whose hooks gather weights inside the forward and cannot be "
            "traced; fully_shard only the root (data_parallel(..., mode='fsdp', blocks=[])), or "
            "compile_sharded each wrapped block instead of the whole model"
        )
        raise NotTraceableError(msg)


def _mesh_of(leaves: list) -> Any:
    for v in leaves:
        if isinstance(v, ShardTensor):
            return v._spec.mesh
    raise AssertionError("no ShardTensor argument")  # pragma: no cover - checked by caller


class _Entry:
    """One input layout: the AOTAutograd function, and the output layouts seen when tracing."""

    def __init__(self, fwd: _ShardedForward, treedef: Any, kinds: tuple, names: tuple,
                 mesh: Any) -> None:  # fmt: skip
        self.fwd, self.mesh = fwd, mesh
        self.out: tuple | None = None
        self.agreed = False
        self.failed = ""  # the verdict's message when some rank could not trace or compile
        self.compiled = _aot(self._traced, fwd.backend, self._agree)
        self.treedef, self.kinds, self.names = treedef, kinds, names

    def _traced(self, state: list, tensors: list) -> list:
        from torch._guards import detect_fake_mode
        from torch.nn.utils.stateless import _reparametrize_module

        mode = detect_fake_mode(tensors)
        if mode is not None:  # real constants of the rules (index plans) enter as graph constants
            mode.allow_non_fake_inputs = True
        args, kwargs = tree_unflatten(_join(self.kinds, tensors), self.treedef)
        with _reparametrize_module(self.fwd.module_ref, dict(zip(self.names, state))):
            out = self.fwd.orig(*args, **kwargs)
        oleaves, otree = tree_flatten(out)
        res, okinds = _split(oleaves)
        self.out = (otree, okinds)
        return res

    def _agree(self, problem: str) -> None:
        """Every rank of the mesh learns whether every rank traced and compiled."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            ok = all_ranks_ok(self.mesh, not problem)
            self.agreed = True
            if not ok:
                name = type(self.fwd.module_ref).__name__
                where = problem or "another rank could not trace or compile it"
                self.failed = f"compile_sharded({name}): {where}"
                raise NotTraceableError(self.failed)

    def __call__(self, state: list, tensors: list) -> list:
        if self.failed:  # every rank knows: raise again without tracing or communicating
            raise NotTraceableError(self.failed)
        if self.agreed:
            return self.compiled(state, tensors)
        debug = collective_check.debug_enabled()
        collective_check.set_debug(False)  # its checks would run on fake tensors
        try:
            with tracing_collectives(), keep_collectives():
                return self.compiled(state, tensors)
        except Exception as exc:
            if not self.agreed:  # this rank failed to trace or compile: tell the others
                why = (_first_line(exc) if isinstance(exc, NotTraceableError)
                       else f"tracing raised {type(exc).__name__}: {_first_line(exc)}")
                self._agree(why)
            raise
        finally:
            collective_check.set_debug(debug)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:400] if text else ""


def _aot(fn: Callable, backend: str, agree: Callable[[str], None]) -> Callable:
    """AOTAutograd of ``fn`` with ``backend``'s compilers; each compiler's success or failure
    is shared with every rank (``agree``) before the compiled graph first runs."""
    from torch._functorch.aot_autograd import aot_function, make_boxed_func

    if backend == "inductor":
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        from torch._inductor.compile_fx import compile_fx_inner
        from torch._inductor.decomposition import select_decomp_table

        inner: Callable = compile_fx_inner
        extra = {"decompositions": select_decomp_table(),
                 "partition_fn": min_cut_rematerialization_partition}  # fmt: skip
    else:

        def inner(gm: Any, example_inputs: Any) -> Any:
            return make_boxed_func(gm)

        extra = {}

    forward_nodes: set[str] = set()

    def fw_compiler(gm: Any, example_inputs: Any) -> Any:
        forward_nodes.update(n.name for n in gm.graph.nodes)
        compiled = inner(gm, example_inputs)
        agree("")
        return compiled

    def bw_compiler(gm: Any, example_inputs: Any) -> Any:
        # AOTAutograd compiles the backward on the first backward, on every rank alike: a rank
        # that fails there tells the others too, instead of leaving them in a collective
        try:
            with keep_collectives():
                _drop_dead_collectives(gm, forward_nodes)
                compiled = inner(gm, example_inputs)
        except Exception as exc:
            agree(f"compiling its backward raised {type(exc).__name__}: {_first_line(exc)}")
            raise
        agree("")
        return compiled

    from torch._functorch import partitioners

    split = extra.pop("partition_fn", partitioners.default_partition)

    def partition_fn(*args: Any, **kwargs: Any) -> Any:
        # the partitioner's last dead-code pass removes collectives whose results this rank
        # does not use (it treats them as pure); their partners still run them and would wait
        # forever. Keep every collective; dead forward copies are dropped per name afterwards.
        saved = partitioners.is_not_collective
        partitioners.is_not_collective = _always
        try:
            return split(*args, **kwargs)
        finally:
            partitioners.is_not_collective = saved

    return aot_function(fn, fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                        partition_fn=partition_fn, **extra)


def _always(node: Any) -> bool:
    return True


def _drop_dead_collectives(gm: Any, forward_nodes: set[str]) -> None:
    """Remove from a backward graph the dead copies of forward collectives.

    The partitioner puts into the backward graph every forward node it can compute from the
    saved values, and keeps collectives among them even when their results are unused (it
    never drops a collective). Which forward values are saved depends on the local shapes (an
    empty shard saves less), so such dead copies of forward collectives appear on some ranks
    only, and the ranks' collectives no longer pair up. They keep their forward names, so only
    collectives named like a forward node and used by nothing are dropped; the backward's own
    collectives stay even when dead on some rank (their partners run on the others)."""

    def impure(node: Any) -> bool:
        if getattr(node.target, "namespace", None) == "_c10d_functional":
            return node.name not in forward_nodes
        return node.is_impure()

    if gm.graph.eliminate_dead_code(is_impure_node=impure):
        gm.recompile()
