"""Checkpoints that carry the model: everything ``meshshard predict`` needs, and no pickle.

A model checkpoint is a directory::

    CKPT/model.json            format, model class and its constructor config, the inputs the
                               model expects, field names and columns, non-dimensional scales,
                               target standardisation, the weights file's size and sha256,
                               every tensor's name, shape and dtype
    CKPT/weights.safetensors   (or weights.pt: a plain state_dict read with weights_only=True)

The model class is looked up by name in a registry (:func:`register_model_class`; meshshard's
reference models are registered), never imported from a path written in the file. Loading
checks, in this order, that ``model.json`` is ours, the class is known (and the one the caller
expects), the weights file has the recorded size and hash, and its tensors are exactly the
ones the class builds with that config; each failure is one ``ModelFileError`` line naming the
file. Writing is atomic (``CKPT.tmp-<pid>``, then :func:`meshshard.store.atomic.publish`);
after a save killed between its two renames, :func:`load_model` reads ``CKPT.old``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from meshshard import models
from meshshard.apps.model_checks import (
    ModelFileError,
    check_declared,
    check_meta,
    check_weights,
    meta_state,
    read_json,
    regular_file,
)
from meshshard.store.atomic import publish, resolve
from meshshard.store.shapes import shape_mismatch

__all__ = [
    "FORMAT",
    "ModelFile",
    "ModelFileError",
    "load_model",
    "register_model_class",
    "registered_model_classes",
    "save_model",
]

log = logging.getLogger(__name__)

FORMAT = "meshshard-model-1"
_JSON = "model.json"
_WEIGHTS = {"safetensors": "weights.safetensors", "torch": "weights.pt"}

_REGISTRY: dict[str, type[nn.Module]] = {}


def register_model_class(cls: type[nn.Module], name: str | None = None, *,
                         override: bool = False) -> type[nn.Module]:
    """Make ``cls`` loadable by name from model checkpoints (refuses to overwrite a name)."""
    name = name or cls.__name__
    if name in _REGISTRY and _REGISTRY[name] is not cls and not override:
        msg = f"model class name {name!r} is already registered ({_REGISTRY[name]}); " \
              "pass override=True to replace it"
        raise ValueError(msg)
    _REGISTRY[name] = cls
    return cls


def registered_model_classes() -> dict[str, type[nn.Module]]:
    _builtin()
    return dict(_REGISTRY)


def _builtin() -> None:
    for name in ("Transolver", "MeshGraphNet", "PointTransformer", "UNet3d", "ViT"):
        _REGISTRY.setdefault(name, getattr(models, name))


@dataclass
class ModelFile:
    """A loaded checkpoint: the model (eval mode, CPU) and what it was trained on.

    Attributes
    ----------
    model : nn.Module
    class_name : str
    config : dict
        Keyword arguments of the class's constructor.
    inputs : dict
        How inputs are built (``part``, ``knn``, ...); see :mod:`meshshard.apps.predict`.
    fields : list of [name, start, stop]
        Output columns of each predicted field (in the store's non-dimensional units).
    scales : dict
        ``dataset``: field -> factor the raw values were divided by; ``u_inf``, ``rho``;
        ``target_mean``/``target_std``: the model's output is ``(y - mean) / std``.
    extra : dict
    path : Path
    """

    model: nn.Module
    class_name: str
    config: dict
    inputs: dict
    fields: list
    scales: dict
    extra: dict = field(default_factory=dict)
    path: Path | None = None

    def field_columns(self) -> dict[str, tuple[int, int]]:
        return {str(n): (int(a), int(b)) for n, a, b in self.fields}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _plain_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A full, CPU, contiguous state dict of ``model`` (plain, DDP or FSDP2: collective then)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                  cpu_offload=True))
    else:
        sd = (model.module if hasattr(model, "module") else model).state_dict()
    out = {}
    for k, v in sd.items():
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        out[k] = v.detach().cpu().contiguous().clone()
    return out


def save_model(
    path: str | Path,
    model: nn.Module,
    *,
    config: dict,
    fields: list,
    scales: dict,
    inputs: dict,
    class_name: str | None = None,
    extra: dict | None = None,
    weights: str = "auto",
) -> Path:
    """Write a model checkpoint directory (see the module docstring), atomically.

    Collective when ``torch.distributed`` is initialised (the full state dict is gathered);
    only rank 0 writes.

    Parameters
    ----------
    path : path
        The checkpoint directory (replaced if it exists).
    model : nn.Module
        Plain, DDP or FSDP2-wrapped; its class (unwrapped) must be registered.
    config : dict
        Constructor keyword arguments (JSON).
    fields : list of [name, start, stop]
        Output columns per field.
    scales, inputs, extra : dict
        JSON; see :class:`ModelFile`.
    weights : {"auto", "safetensors", "torch"}
        ``auto``: safetensors when installed, else a torch file.
    """
    import torch.distributed as dist

    _builtin()
    inner = model.module if hasattr(model, "module") else model
    # the registered class itself or its nearest registered base (FSDP2 makes a subclass)
    known = {c: n for n, c in _REGISTRY.items()}
    found = next((known[c] for c in type(inner).__mro__ if c in known), type(inner).__name__)
    name = class_name or found
    if _REGISTRY.get(name) is None:
        msg = f"model class {name!r} is not registered; call register_model_class first"
        raise ModelFileError(msg)
    if weights == "auto":
        try:
            import safetensors  # noqa: F401

            weights = "safetensors"
        except ImportError:
            weights = "torch"
    if weights not in _WEIGHTS:
        msg = f"weights={weights!r} must be 'auto', 'safetensors' or 'torch'"
        raise ValueError(msg)
    meta = {"format": FORMAT, "class": name, "config": config, "inputs": inputs,
            "fields": [[str(n), int(a), int(b)] for n, a, b in fields], "scales": scales,
            "extra": extra or {}}
    json.dumps(meta)  # fail early (every rank) on values JSON cannot hold
    state = _plain_state(model)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    path = Path(path)
    if rank == 0:
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        wfile = tmp / _WEIGHTS[weights]
        if weights == "safetensors":
            from safetensors.torch import save_file

            save_file(state, str(wfile))
        else:
            torch.save(state, wfile)
        meta["weights"] = {"file": wfile.name, "kind": weights, "size": wfile.stat().st_size,
                           "sha256": _sha256(wfile)}
        meta["tensors"] = {k: [list(v.shape), str(v.dtype).removeprefix("torch.")]
                           for k, v in state.items()}
        with open(tmp / _JSON, "w") as fh:
            json.dump(meta, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        publish(tmp, path, _old(path))  # PATH or PATH.old is complete at every instant
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    return path


def _old(path: Path) -> Path:
    """Where the previous version waits while a save swaps the new one in."""
    return path.with_name(path.name + ".old")


def _read_meta(path: Path) -> dict:
    f = path / _JSON
    if not path.is_dir():
        msg = f"{path}: no model checkpoint there (want a directory holding {_JSON})"
        raise FileNotFoundError(msg)
    if not f.exists() and not f.is_symlink():
        msg = f"{path}: not a model checkpoint (no {_JSON}; a training checkpoint of " \
              "torch.distributed.checkpoint is not one: export it with save_model)"
        raise ModelFileError(msg)
    meta = read_json(f, path)  # a regular file in PATH, size and depth capped
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        msg = f"{f}: not a meshshard model checkpoint (format {got!r}, want {FORMAT})"
        raise ModelFileError(msg)
    for k, t in (("class", str), ("config", dict), ("inputs", dict), ("fields", list),
                 ("scales", dict), ("weights", dict), ("tensors", dict)):
        if not isinstance(meta.get(k), t):
            msg = f"{f}: {k!r} missing or not a {t.__name__}"
            raise ModelFileError(msg)
    return meta


def _weights_file(path: Path, meta: dict) -> tuple[Path, int]:
    """The weights file (a regular file in ``path``) and its size, as recorded."""
    w = meta["weights"]
    wfile = path / str(w.get("file", ""))
    if wfile.name not in _WEIGHTS.values() or not (wfile.exists() or wfile.is_symlink()):
        msg = f"{path}: weights file {w.get('file')!r} missing"
        raise ModelFileError(msg)
    size = regular_file(wfile, path)
    if size != w.get("size"):
        msg = f"{wfile}: truncated or replaced weights file ({size} bytes, {_JSON} records " \
              f"{w.get('size')}); copy the checkpoint again"
        raise ModelFileError(msg)
    return wfile, size


def _read_weights(path: Path, meta: dict) -> dict[str, torch.Tensor]:
    wfile, _ = _weights_file(path, meta)
    if _sha256(wfile) != meta["weights"].get("sha256"):
        msg = f"{wfile}: weights file is corrupt (sha256 differs from {_JSON}); copy it again"
        raise ModelFileError(msg)
    try:
        if wfile.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(wfile))
        else:
            state = torch.load(wfile, map_location="cpu", weights_only=True)
    except ImportError as exc:
        msg = f"{wfile}: reading safetensors needs the 'safetensors' package " \
              "(pip install meshshard[safetensors])"
        raise ModelFileError(msg) from exc
    except Exception as exc:
        msg = f"{wfile}: unreadable weights ({type(exc).__name__}: {str(exc)[:200]})"
        raise ModelFileError(msg) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        msg = f"{wfile}: not a dict of tensors"
        raise ModelFileError(msg)
    return state


def _compare(path: Path, class_name: str, state: dict, want: dict) -> None:
    problem = shape_mismatch({k: v.shape for k, v in state.items()},
                             {k: v.shape for k, v in want.items()})
    if problem:
        msg = f"{path}: weights are not those of a {class_name} with this config: {problem}"
        raise ModelFileError(msg)


def load_model(path: str | Path, *, expect_class: str | tuple[str, ...] | None = None) -> ModelFile:
    """Read a model checkpoint written by :func:`save_model`; the model is built, loaded, in
    eval mode, on the CPU. No collective.

    Raises
    ------
    FileNotFoundError
        No directory at ``path`` (nor a ``PATH.old`` left by an interrupted save).
    ModelFileError
        Not a model checkpoint; unknown class or not ``expect_class``; truncated or corrupt
        weights; weights that do not fit the class and config.
    """
    _builtin()
    path = Path(path)
    found = resolve(path, _old(path))
    if found is not None and found != path:
        log.warning("%s missing; loading %s left by an interrupted save", path, found)
        path = found
    meta = _read_meta(path)
    name = meta["class"]
    cls = _REGISTRY.get(name)
    if cls is None:
        msg = f"{path}: model class {name!r} is unknown here (registered: {sorted(_REGISTRY)})"
        raise ModelFileError(msg)
    if expect_class is not None:
        allowed = (expect_class,) if isinstance(expect_class, str) else tuple(expect_class)
        if name not in allowed:
            msg = f"{path}: holds a {name}, but this needs one of {list(allowed)}"
            raise ModelFileError(msg)
    # the model on the meta device against what model.json declares, before any allocation
    check_meta(path / _JSON, meta)
    wfile, size = _weights_file(path, meta)
    want = meta_state(path, cls, name, meta["config"])
    check_declared(path, name, want, meta["tensors"], size)
    state = _read_weights(path, meta)
    _compare(path, name, state, want)
    check_weights(wfile, state, meta["tensors"])
    try:
        model = cls(**meta["config"])
    except Exception as exc:  # built on meta above; a class that fails only on the CPU
        msg = f"{path}: config does not fit {name} ({type(exc).__name__}: {str(exc)[:200]})"
        raise ModelFileError(msg) from None
    model.load_state_dict(state)
    model.eval()
    return ModelFile(model, name, meta["config"], meta["inputs"], meta["fields"],
                     meta["scales"], meta.get("extra", {}), path)


def describe(mf: ModelFile) -> dict[str, Any]:
    """A short JSON summary (for logs and reports)."""
    n = sum(p.numel() for p in mf.model.parameters())
    return {"path": str(mf.path), "class": mf.class_name, "parameters": n,
            "fields": [f[0] for f in mf.fields], "inputs": mf.inputs}
