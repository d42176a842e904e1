"""Distributed checkpoints (``torch.distributed.checkpoint``) that survive a change of mesh.

:func:`save_checkpoint` writes the model and optimizer state *sharded* (each rank writes its
own FSDP2 shards; replicated DDP state is written once) and :func:`load_checkpoint` reads it
into a model wrapped for any other mesh shape (e.g. saved on 4 ranks as 2 x 2 data x domain,
loaded on 2 ranks as 1 x 2): DCP reshards by fully-qualified parameter name, and
:func:`torch.distributed.checkpoint.state_dict.get_state_dict` hides the DDP/FSDP2 wrappers.

Layout of a checkpoint ``PATH`` (a directory)::

    PATH/.metadata, PATH/__<rank>_0.distcp   DCP's files
    PATH/meshshard.json                      format, step, user extras, every tensor's shape

Nothing is executed from a checkpoint: DCP's pickled ``.metadata`` is read with a restricted
unpickler that admits only DCP's metadata classes, and non-tensor items with
``torch.load(weights_only=True)`` (:mod:`meshshard.parallel._safe_dcp`); anything else is refused
with a :class:`CheckpointError` naming the file.

Atomic: every rank writes into ``PATH.tmp``; only after every rank finished (and the
metadata is on disk) does rank 0 move the old ``PATH`` aside to ``PATH.old``, rename
``PATH.tmp`` to ``PATH`` and delete ``PATH.old`` (:func:`meshshard.store.atomic.publish`; a
``PATH.old`` left with no ``PATH`` is kept until the new checkpoint is in place). An
interrupted save therefore leaves ``PATH`` (or, if it stopped between the two renames,
``PATH.old``, which :func:`load_checkpoint` falls back to) as the last good checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from meshshard.errors import StoreError
from meshshard.parallel._safe_dcp import SafePlanner, SafeReader, UnsafeCheckpoint, read_metadata
from meshshard.store.atomic import publish
from meshshard.store.shapes import shape_mismatch

log = logging.getLogger(__name__)

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint"]

FORMAT = "meshshard-dcp-1"
_META = "meshshard.json"


class CheckpointError(StoreError):
    """A checkpoint that cannot be loaded into this model (foreign, corrupt, other model)."""


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _shapes(state: dict, prefix: str = "") -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_shapes(v, key + "."))
        elif isinstance(v, torch.Tensor):
            out[key] = list(v.shape)  # DTensor: the global shape
    return out


def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": msd}
    if optimizer is not None:
        state["optim"] = osd
    return state


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    step: int = 0,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Save ``model`` (plain, DDP or FSDP2) and ``optimizer`` sharded to directory ``path``,
    atomically (see the module docstring). ``extra`` must be JSON-serialisable.

    Collective: every rank of the default process group must call this. A failure on any rank
    (e.g. a full disk) raises on every rank and leaves the previous checkpoint in place.
    """
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    old = path.with_name(path.name + ".old")
    meta = {"format": FORMAT, "step": int(step), "extra": extra or {}}
    json.dumps(meta)  # fail early (on every rank) on extras that JSON cannot hold
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # debris of an earlier interrupted save
        tmp.mkdir(parents=True)
    _barrier()
    state = _state(model, optimizer)
    try:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp))
    except CheckpointException as exc:  # a BaseException: raised on every rank by DCP
        msg = (
            f"saving checkpoint {path} failed on rank(s) {sorted(exc.failures)}: "
            f"{_first_failure(exc)}; the previous checkpoint (if any) is unchanged"
        )
        raise OSError(msg) from None
    if _rank() == 0:
        meta["shapes"] = _shapes(state)
        with open(tmp / _META, "w") as fh:
            json.dump(meta, fh)
            fh.flush()
            os.fsync(fh.fileno())
    _barrier()  # every rank's shards are on disk before anything is renamed
    if _rank() == 0:  # PATH or PATH.old holds a complete checkpoint at every instant
        publish(tmp, path, old)
    _barrier()
    return path


def _first_failure(exc: Any) -> str:
    for err in exc.failures.values():
        if isinstance(err, tuple):  # DCP wraps each rank's exception with its traceback
            err = err[0]
        return f"{type(err).__name__}: {err}"
    return str(exc)


def _read_meta(path: Path) -> dict:
    f = path / _META
    try:
        meta = json.loads(f.read_text())
    except FileNotFoundError:
        msg = f"{path}: not a meshshard checkpoint (no {_META})"
        raise CheckpointError(msg) from None
    except (OSError, ValueError) as exc:
        msg = f"{f}: corrupt or unreadable checkpoint metadata ({exc})"
        raise CheckpointError(msg) from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        msg = f"{f}: not a meshshard checkpoint (format {meta.get('format')!r}, want {FORMAT})"
        raise CheckpointError(msg)
    return meta


def _read_dcp_metadata(path: Path) -> None:
    """DCP's ``.metadata``, read with only DCP's metadata classes admitted (never plain pickle:
    torch's own reader would run whatever a crafted file asks for)."""
    f = path / ".metadata"
    try:
        read_metadata(f)
    except FileNotFoundError:
        msg = f"{path}: incomplete checkpoint (no {f.name})"
        raise CheckpointError(msg) from None
    except (UnsafeCheckpoint, ValueError, OSError) as exc:
        raise CheckpointError(str(exc)) from None


def _compare(path: Path, saved: dict, want: dict) -> None:
    problem = shape_mismatch(saved, want)
    if problem:
        msg = f"{path}: checkpoint is from a different model: {problem}"
        raise CheckpointError(msg)


def _agree(error: Exception | None) -> None:
    """Every rank learns whether any rank failed, so all raise instead of some hanging."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        if error is not None:
            raise error
        return
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag)
    if error is not None:
        raise error
    if int(flag.item()):
        msg = "load_checkpoint failed on another rank (see its error); nothing was loaded"
        raise CheckpointError(msg)


def load_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` into ``model`` (plain, DDP or FSDP2,
    on any mesh shape) and ``optimizer``, in place. Returns ``{"step": ..., "extra": ...}``.

    Raises
    ------
    FileNotFoundError
        No checkpoint at ``path`` (nor a ``PATH.old`` left by an interrupted save).
    CheckpointError
        Foreign or corrupt checkpoint, or one from a different model (tensor names or shapes
        differ; the message lists them). Raised on every rank, before anything is loaded.

    Collective: every rank of the default process group must call this.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    error: Exception | None = None
    meta: dict = {}
    state: dict = {}
    try:
        if not path.exists():
            old = path.with_name(path.name + ".old")
            if not old.exists():
                msg = f"{path}: no checkpoint there"
                raise FileNotFoundError(msg)
            log.warning("%s missing; loading %s left by an interrupted save", path, old)
            path = old
        meta = _read_meta(path)
        _read_dcp_metadata(path)  # refuses a .metadata that would run code, before DCP sees it
        state = _state(model, optimizer)
        want = _shapes(state)
        if optimizer is None:
            saved = {k: v for k, v in meta["shapes"].items() if k.startswith("model.")}
        else:
            saved = meta["shapes"]
        _compare(path, saved, want)
    except (FileNotFoundError, CheckpointError) as exc:
        error = exc
    _agree(error)
    try:
        dcp.load(state, storage_reader=SafeReader(path), planner=SafePlanner(path))
    except UnsafeCheckpoint as exc:  # raised on the coordinator before DCP's collectives
        raise CheckpointError(str(exc)) from None
    except CheckpointException as exc:
        for err in exc.failures.values():
            err = err[0] if isinstance(err, tuple) else err
            if isinstance(err, UnsafeCheckpoint):
                raise CheckpointError(str(err)) from None
        msg = f"{path}: loading failed on rank(s) {sorted(exc.failures)}: {_first_failure(exc)}"
        raise CheckpointError(msg) from None
    set_state_dict(
        model,
        optimizer if optimizer is not None else [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optim", {}),
    )
    return {"step": int(meta["step"]), "extra": meta.get("extra", {}), "path": path}
