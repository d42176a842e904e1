"""Compile the local computation of row-local blocks: ShardTensor dispatch once per block.

``torch.compile(model)`` on ShardTensor inputs runs, but every torch function on a ShardTensor
is a graph break (the sharding rules run eagerly, see ``ShardTensor.__torch_function__``), so it
removes no dispatch overhead. :func:`compile_local` does: for a block whose output rows depend
only on the same input rows (pointwise MLPs, linears, layer norms over features, activations),
the block's forward on ShardTensor inputs becomes

1. unwrap the inputs to their local pieces (reduce Partial inputs first),
2. mark the parameters so that their gradients are summed over the sharded mesh dims in
   backward (one flat all-reduce per block, as the eager rules do per use),
3. one ``torch.compile``-d call of the block's own forward on the local tensors,
4. wrap the outputs with the inputs' layout.

The first call for an input layout checks (under ``no_grad``) that the block really is local:
its eager ShardTensor forward must issue no collective, keep the inputs' placements and shard
sizes, and equal the plain forward on the local pieces. Every rank takes part in the verdict
(one small all-reduce), so a block that is not local raises :class:`LocalityError` on every rank
instead of returning a wrong answer or hanging.
"""

from __future__ import annotations

import copy
import fnmatch
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Shard

from meshshard.shardtensor._compile_check import LocalityError, verify_local
from meshshard.shardtensor._layout import LayoutError, check_same_mesh, reduce_partials
from meshshard.shardtensor._tracemode import tracing
from meshshard.shardtensor.api import ShardTensor, dynamo_opaque
from meshshard.shardtensor.spec import ShardSpec

__all__ = ["LocalityError", "compile_local", "compile_local_plan", "is_compiled_local"]


def compile_local(module: nn.Module, *, check: bool = True, **compile_kwargs: Any) -> nn.Module:
    """Run ``module`` on ShardTensor inputs as one compiled call on the local pieces.

    In place (``state_dict`` keys, hooks and parameters are unchanged); returns ``module``.
    For blocks with no cross-rank work: every output row depends only on the same input row
    and on the parameters (MLPs, linears, LayerNorm over features, activations, dropout). The
    ShardTensor inputs must share one layout (placements and shard sizes). Plain-tensor calls
    run the module's own forward unchanged, and ``torch.compile`` of an enclosing model treats
    the block as one opaque call (one graph break) that runs the compiled local function.

    Parameters
    ----------
    module : nn.Module
        The block. Its parameters are treated as replicated.
    check : bool
        Verify locality on the first call for each input layout (one extra eager forward of the
        block and one small all-reduce over the mesh). With ``check=False`` locality is the
        caller's promise.
    **compile_kwargs
        Passed to ``torch.compile`` (e.g. ``backend="aot_eager"``, ``dynamic=True``).

    Notes
    -----
    Results equal eager to float rounding (inductor may fuse and reorder); dropout inside a
    compiled block draws inductor's random numbers, not eager's masks. Each rank compiles for
    its own local shapes (an empty shard is specialised separately). A rank whose compilation
    fails raises there only; the others then wait in the next collective until the process
    group's timeout.

    Returns
    -------
    nn.Module
        ``module`` itself.

    Raises
    ------
    LocalityError
        On every rank, when the check finds that the block communicates, changes the layout,
        or computes something else on the local pieces (e.g. it uses the global point count).
    meshshard.shardtensor.LayoutError
        When the ShardTensor inputs of one call have different layouts.

    Collective: a call on ShardTensor inputs is collective over the mesh in backward (gradient
    all-reduce of the parameters) and on a checked first call.

    Example
    -------
    >>> for block in model.blocks:                       # doctest: +SKIP
    ...     compile_local(block.mlp)
    """
    if not isinstance(module, nn.Module):
        msg = f"compile_local needs an nn.Module, got {type(module).__name__}"
        raise TypeError(msg)
    if is_compiled_local(module):
        return module
    module.forward = _LocalForward(module, check, compile_kwargs)
    return module


def compile_local_plan(
    model: nn.Module, patterns: Sequence[str], *, check: bool = True, **compile_kwargs: Any
) -> list[str]:
    """Apply :func:`compile_local` to every submodule of ``model`` whose qualified name matches
    one of ``patterns`` (``fnmatch`` style, e.g. ``"blocks.*.mlp"``); returns the names, in
    model order. No model edits: the plan is data.

    Raises
    ------
    ValueError
        A pattern that matches no submodule (names what exists), or two matches nested in each
        other (compile the outer one only).
    """
    names = [n for n, _ in model.named_modules() if n]
    chosen: list[str] = []
    for pat in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            msg = (
                f"compile_local_plan: pattern {pat!r} matches no submodule of "
                f"{type(model).__name__}; its submodules are: {', '.join(names[:40])}"
                + (" ..." if len(names) > 40 else "")
            )
            raise ValueError(msg)
        chosen += [h for h in hits if h not in chosen]
    for a in chosen:
        for b in chosen:
            if b.startswith(a + "."):
                msg = f"compile_local_plan: {b!r} lies inside {a!r}; compile one of them"
                raise ValueError(msg)
    order = {n: i for i, n in enumerate(names)}
    chosen.sort(key=order.__getitem__)
    modules = dict(model.named_modules())
    for n in chosen:
        compile_local(modules[n], check=check, **compile_kwargs)
    return chosen


def is_compiled_local(module: nn.Module) -> bool:
    """Whether :func:`compile_local` was applied to ``module``."""
    return isinstance(module.__dict__.get("forward"), _LocalForward)


class _LocalForward:
    """The replacement ``forward``: plain inputs -> the module's own forward; ShardTensor
    inputs -> :meth:`run` (opaque to an enclosing torch.compile)."""

    def __init__(self, module: nn.Module, check: bool, compile_kwargs: dict) -> None:
        self.orig = type(module).forward.__get__(module)
        self.module_ref = module
        self.check = check
        self.compile_kwargs = compile_kwargs
        self.compiled: Callable | None = None
        self.verified: set = set()
        self.groups: dict = {}
        self.out_specs: dict = {}
        self.members: dict = {}

    def state(self, kind: dict) -> dict[str, torch.Tensor]:
        """name -> tensor of every parameter (``kind`` = module._parameters) or buffer, looked
        up afresh each call (wrappers such as FSDP may swap them) along cached paths."""
        attr = "_parameters" if kind is self.module_ref._parameters else "_buffers"
        paths = self.members.get(attr)
        if paths is None:
            paths = self.members[attr] = [
                (f"{prefix}.{name}" if prefix else name, sub, name)
                for prefix, sub in self.module_ref.named_modules()
                for name in getattr(sub, attr)
            ]
        out = {}
        for full, sub, name in paths:
            t = getattr(sub, attr).get(name)
            if t is not None:
                out[full] = t
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if tracing():  # compile_sharded traces the whole model: the eager rules go into it
            return self.orig(*args, **kwargs)
        for v in (*args, *kwargs.values()):
            if isinstance(v, ShardTensor):
                return _run(self, args, kwargs)
        return self.orig(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> _LocalForward:
        # a copied module gets its own (not yet compiled) local function
        return _LocalForward(copy.deepcopy(self.module_ref, memo), self.check,
                             dict(self.compile_kwargs))

    def local_fn(self) -> Callable:
        if self.compiled is None:
            from torch.nn.utils.stateless import _reparametrize_module

            module, orig = self.module_ref, self.orig

            def local_call(pb: dict, args: tuple, kwargs: dict) -> Any:
                # torch.func.functional_call without module.__call__: the module's hooks
                # already ran once, on the ShardTensor call
                with _reparametrize_module(module, pb):
                    return orig(*args, **kwargs)

            # dynamo caches compiled code per code object: one code object per block, or all
            # blocks share one cache and hit the recompile limit
            code = local_call.__code__.replace(co_name=f"local_{type(module).__name__}")
            fn = types.FunctionType(code, local_call.__globals__, code.co_name, None,
                                    local_call.__closure__)
            self.compiled = torch.compile(fn, **self.compile_kwargs)
        return self.compiled


def _run_impl(fwd: _LocalForward, args: tuple, kwargs: dict) -> Any:
    module = fwd.module_ref
    args = tuple(reduce_partials(a) if isinstance(a, ShardTensor) else a for a in args)
    kwargs = {k: reduce_partials(v) if isinstance(v, ShardTensor) else v
              for k, v in kwargs.items()}
    spec = _common_spec(module, [*args, *kwargs.values()])
    if fwd.check:
        key = (spec.placements, _trivial(spec), module.training,
               tuple(_arg_key(v) for v in (*args, *kwargs.values())))
        if key not in fwd.verified:
            verify_local(fwd, spec, args, kwargs)
            fwd.verified.add(key)
    groups = fwd.groups.get(spec.placements)
    if groups is None:
        groups = fwd.groups[spec.placements] = tuple(
            spec.mesh.get_group(i) for i, p in enumerate(spec.placements)
            if isinstance(p, Shard) and spec.mesh.size(i) > 1
        )
    largs = tuple(a._local if isinstance(a, ShardTensor) else a for a in args)
    lkw = {k: v._local if isinstance(v, ShardTensor) else v for k, v in kwargs.items()}
    pb = fwd.state(module._parameters)
    names = [n for n, p in pb.items() if p.requires_grad]
    # plain tensors given as arguments are replicated too; their gradients need the same sum
    plain = [i for i, a in enumerate(args) if _needs_grad_sum(a)]
    plain_kw = [k for k, v in kwargs.items() if _needs_grad_sum(v)]
    if groups and torch.is_grad_enabled() and (names or plain or plain_kw):
        ins = [pb[n] for n in names] + [largs[i] for i in plain] + [lkw[k] for k in plain_kw]
        outs = _GradSumMany.apply(groups, *ins)
        for n, o in zip(names, outs[: len(names)]):
            pb[n] = o
        largs = list(largs)
        for i, o in zip(plain, outs[len(names) : len(names) + len(plain)]):
            largs[i] = o
        largs = tuple(largs)
        for k, o in zip(plain_kw, outs[len(names) + len(plain) :]):
            lkw[k] = o
    pb.update(fwd.state(module._buffers))
    out = fwd.local_fn()(pb, largs, lkw)
    return _wrap_outputs(out, spec, fwd.out_specs)


# the ShardTensor path, opaque to an enclosing torch.compile (the local function compiles
# itself)
_run = dynamo_opaque(_run_impl)


def _needs_grad_sum(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and not isinstance(v, ShardTensor) and v.requires_grad


def _arg_key(v: Any) -> Any:
    if isinstance(v, ShardTensor):
        return ("S", v.ndim, v.dtype)
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), v.dtype)
    return (type(v).__name__,)


def _trivial(spec: ShardSpec) -> bool:
    """Every rank holds all rows or none: a check on such a layout cannot see a block that uses
    the global size, so it does not vouch for other layouts."""
    return all(s is None or all(v in (0, sum(s)) for v in s) for s in spec.sizes)


def _common_spec(module: nn.Module, values: list) -> ShardSpec:
    sts = [v for v in values if isinstance(v, ShardTensor)]
    check_same_mesh(sts)
    first = sts[0]._spec
    for t in sts[1:]:
        if t._spec.placements != first.placements or t._spec.sizes != first.sizes:
            msg = (
                f"compile_local({type(module).__name__}): ShardTensor inputs have different "
                f"layouts ({first.describe()} and {t._spec.describe()}); redistribute one, e.g. "
                "b = b.redistribute(a.placements, sizes=a.sharding_sizes())"
            )
            raise LayoutError(msg)
    return first


def _wrap_outputs(out: Any, spec: ShardSpec, cache: dict) -> Any:
    if isinstance(out, torch.Tensor):
        key = (spec, out.shape)
        ospec = cache.get(key)
        if ospec is None:
            if len(cache) > 256:
                cache.clear()
            ospec = cache[key] = _out_spec(out, spec)
        return ShardTensor(out, ospec)
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap_outputs(o, spec, cache) for o in out)
    return out


def _out_spec(local: torch.Tensor, spec: ShardSpec) -> ShardSpec:
    shape = list(local.shape)
    coord = spec.coordinate()
    for i, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            if p.dim >= local.ndim or shape[p.dim] != spec.sizes[i][coord[i]]:
                msg = (
                    f"compile_local: a local output of shape {tuple(local.shape)} does not keep "
                    f"the {spec.sizes[i][coord[i]]} local rows of the input's sharded dim "
                    f"{p.dim}; the block is not row-local"
                )
                raise LocalityError(msg)
            shape[p.dim] = int(sum(spec.sizes[i]))
    return ShardSpec(spec.mesh, spec.placements, spec.sizes, torch.Size(shape))


class _GradSumMany(torch.autograd.Function):
    """Identity forward; backward sums the gradients of all inputs over ``groups`` in one flat
    all-reduce (replicated parameters used on local rows get only this rank's part)."""

    @staticmethod
    def forward(ctx, groups: tuple, *xs: torch.Tensor):
        ctx.groups = groups
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *gs: torch.Tensor):
        from meshshard.collective_check import check_collective

        dtypes = {g.dtype for g in gs}
        if len(dtypes) == 1:
            flat = torch.cat([g.reshape(-1) for g in gs])
            for group in ctx.groups:
                check_collective("all_reduce", group, flat, detail="sum: block gradients")
                dist.all_reduce(flat, group=group)
            out, off = [], 0
            for g in gs:
                out.append(flat[off : off + g.numel()].view_as(g))
                off += g.numel()
        else:
            out = []
            for g in gs:
                g = g.contiguous().clone()
                for group in ctx.groups:
                    check_collective("all_reduce", group, g, detail="sum: block gradient")
                    dist.all_reduce(g, group=group)
                out.append(g)
        return (None, *out)

