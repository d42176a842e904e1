"""The first-call check of :func:`meshshard.shardtensor.compile.compile_local`: is a block
row-local on ShardTensor inputs? Every rank takes part in the verdict."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import Partial

from meshshard.errors import LayoutError
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.spec import ShardSpec

__all__ = ["LocalityError", "all_ranks_ok", "verify_local"]

# the collectives a block could issue in forward; counted while a block is checked
_DIST_FUNCS = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "broadcast", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "gather", "send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier",
)
_all_reduce = dist.all_reduce  # the verdict's own collective, never counted
_patch_lock = threading.Lock()


class LocalityError(LayoutError):
    """A block given to :func:`compile_local` is not row-local on ShardTensor inputs."""


@contextlib.contextmanager
def _count_collectives():
    calls: list[str] = []
    saved = {}
    with _patch_lock:
        for name in _DIST_FUNCS:
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            saved[name] = fn

            def counting(*a, _fn=fn, _name=name, **k):
                calls.append(_name)
                return _fn(*a, **k)

            setattr(dist, name, counting)
        try:
            yield calls
        finally:
            for name, fn in saved.items():
                setattr(dist, name, fn)


def all_ranks_ok(mesh: Any, ok: bool) -> bool:
    """Whether ``ok`` holds on every rank of ``mesh`` (one small all-reduce per mesh dim).

    Collective: every rank of the mesh must call it."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    if mesh.device_type == "cuda":
        flag = flag.cuda()
    for i in range(mesh.ndim):
        if mesh.size(i) > 1:
            _all_reduce(flag, op=dist.ReduceOp.MIN, group=mesh.get_group(i))
    return bool(flag.item())


def verify_local(fwd: Any, spec: ShardSpec, args: tuple, kwargs: dict) -> None:
    """Every rank: eager ShardTensor forward vs plain forward on the local pieces."""
    module = fwd.module_ref
    problem = ""
    largs = tuple(a._local if isinstance(a, ShardTensor) else a for a in args)
    lkw = {k: v._local if isinstance(v, ShardTensor) else v for k, v in kwargs.items()}
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            state = torch.get_rng_state()
            with _count_collectives() as calls:
                eager = fwd.orig(*args, **kwargs)
            torch.set_rng_state(state)
            local = fwd.orig(*largs, **lkw)
        if calls:
            problem = f"its forward communicates ({', '.join(sorted(set(calls)))})"
        else:
            problem = _compare(eager, local, spec)
    except Exception as exc:  # turned into a verdict every rank shares
        problem = f"checking it raised {type(exc).__name__}: {exc}"
    if not all_ranks_ok(spec.mesh, not problem):
        where = problem or "another rank found it is not (its local rows differ)"
        msg = (
            f"compile_local({type(module).__name__}) needs a row-local block on inputs laid out "
            f"{spec.describe()}, but {where}. Compile the row-local sub-blocks instead (e.g. "
            "the MLPs and norms), or leave this block eager."
        )
        raise LocalityError(msg)


def _compare(eager: Any, local: Any, spec: ShardSpec) -> str:
    e_flat, _ = torch.utils._pytree.tree_flatten(eager)
    l_flat, _ = torch.utils._pytree.tree_flatten(local)
    if len(e_flat) != len(l_flat):
        return "its outputs differ in structure between ShardTensor and local inputs"
    for k, (e, loc) in enumerate(zip(e_flat, l_flat)):
        if not isinstance(e, torch.Tensor):
            if e != loc:
                return f"output {k} is {e!r} on ShardTensors but {loc!r} on the local pieces"
            continue
        if not isinstance(e, ShardTensor):
            return f"output {k} is a plain tensor on ShardTensor inputs"
        es = e._spec
        if es.placements != spec.placements or es.sizes != spec.sizes:
            return (
                f"output {k} is laid out {es.describe()}, not like its inputs "
                f"({[str(p) for p in spec.placements]} with the same sizes)"
            )
        if any(isinstance(p, (Partial,)) for p in es.placements):
            return f"output {k} is Partial"
        el = e._local
        if el.shape != loc.shape:
            return (
                f"output {k} has local shape {tuple(loc.shape)} on the local pieces but "
                f"{tuple(el.shape)} on ShardTensors (does it use the global size?)"
            )
        if el.is_floating_point():
            scale = float(el.abs().max()) if el.numel() else 0.0
            if not torch.allclose(el, loc, rtol=1e-5, atol=1e-5 * scale + 1e-7):
                return f"output {k} differs on the local pieces (does it use the global size?)"
        elif not torch.equal(el, loc):
            return f"output {k} differs on the local pieces"
    return ""
