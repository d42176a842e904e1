"""The checks a model checkpoint passes before anything heavy is read or built.

:func:`~meshshard.apps.model_file.load_model` runs them in this order, each failure one
:class:`~meshshard.apps.model_file.ModelFileError` line naming the file and the key:

1. the files: only regular files inside the checkpoint directory (no FIFO, no device, no
   symlink out of it), ``model.json`` under :data:`MAX_JSON_BYTES` and nested at most
   :data:`MAX_JSON_DEPTH` deep (:func:`read_json`, :func:`regular_file`);
2. the metadata: ``fields`` against the model's output width (in range, not overlapping, not
   empty), ``scales`` (``target_mean``/``target_std`` finite, one per output, std > 0;
   ``u_inf``/``rho``/dataset factors finite and > 0), ``inputs.knn`` an int >= 1
   (:func:`check_meta`);
3. the declared tensors: the model is built on the meta device (nothing allocated) and every
   tensor's name, shape and dtype is compared with what ``model.json`` declares, and their
   bytes with the weights file's size (:func:`check_declared`) -- a small directory that
   declares a huge model fails here, before any allocation;
4. the weights read: names, shapes and dtypes equal to the declared ones (an int32 tensor is
   not cast into a float parameter), every floating value finite (:func:`check_weights`).

Only then is the model materialised on the CPU and loaded.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import torch

from meshshard.errors import InputError
from meshshard.store.curator_checks import FLOW_RANGE
from meshshard.store.shapes import shape_mismatch

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "ModelFileError", "check_declared",
           "check_for_inference", "check_meta", "check_weights", "meta_state", "output_width",
           "read_json", "regular_file"]

#: the largest ``model.json`` read (a tensor list of a large model is well under 1 MB)
MAX_JSON_BYTES = 16 << 20
#: the deepest nesting of ``model.json`` (ours is 4 deep)
MAX_JSON_DEPTH = 32
#: config keys that give a registered class's output width
_OUT_KEYS = ("out_dim", "out", "out_channels")


class ModelFileError(InputError):
    """A model checkpoint that cannot be used: foreign, truncated, or another model
    (re-exported by :mod:`meshshard.apps.model_file`)."""


def _error(msg: str) -> Exception:
    return ModelFileError(msg)


def regular_file(path: Path, root: Path, *, max_bytes: int | None = None) -> int:
    """The size of ``path``, a regular file inside ``root`` (after symlinks), else an error.

    Nothing is opened: a FIFO (which would block a reader forever) or a device
    (``/dev/zero``, endless) is refused from its ``stat``.
    """
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        msg = f"{path}: missing (or a broken symlink)"
        raise _error(msg) from None
    if not real.is_relative_to(root.resolve()):
        msg = f"{path}: is a symlink to {real}, outside the checkpoint {root}; copy the file in"
        raise _error(msg)
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        msg = f"{path}: not a regular file (a FIFO, device or directory); a checkpoint holds " \
              "plain files"
        raise _error(msg)
    if max_bytes is not None and st.st_size > max_bytes:
        msg = f"{path}: {st.st_size} bytes, more than the {max_bytes} a model.json may have"
        raise _error(msg)
    return int(st.st_size)


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON (iterative: no recursion limit to hit)."""
    top, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        top = max(top, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return top


def read_json(path: Path, root: Path) -> Any:
    """``path`` parsed, after :func:`regular_file` (size cap) and with its depth capped."""
    regular_file(path, root, max_bytes=MAX_JSON_BYTES)
    try:
        with open(path, "rb") as fh:
            value = json.loads(fh.read(MAX_JSON_BYTES + 1))
    except RecursionError:
        value = None
        deep = True
    except (OSError, ValueError) as exc:
        msg = f"{path}: corrupt model checkpoint metadata ({str(exc)[:200]})"
        raise _error(msg) from None
    else:
        deep = _depth(value) > MAX_JSON_DEPTH
    if deep:
        msg = f"{path}: nested deeper than {MAX_JSON_DEPTH} levels; not a model.json we write"
        raise _error(msg)
    return value


def _finite_numbers(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v)))


def output_width(config: dict) -> int | None:
    """The model's output columns from its constructor config (None: not stated)."""
    for k in _OUT_KEYS:
        v = config.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _check_fields(f: Path, fields: Any, width: int | None) -> None:
    if not fields:
        msg = f"{f}: 'fields' is empty; the model must name the fields of its output columns"
        raise _error(msg)
    spans = []
    for i, item in enumerate(fields):
        ok = (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
              and all(isinstance(x, int) and not isinstance(x, bool) for x in item[1:]))
        if not ok:
            msg = f"{f}: 'fields'[{i}] = {item!r} must be [name, start, stop] (a string, two ints)"
            raise _error(msg)
        name, a, b = item
        if not 0 <= a < b or (width is not None and b > width):
            top = f"{width}" if width is not None else "the output width"
            msg = f"{f}: 'fields' {name!r} has columns [{a}, {b}); want 0 <= start < stop <= {top}"
            raise _error(msg)
        spans.append((a, b, name))
    spans.sort()
    for (a0, b0, n0), (a1, _, n1) in zip(spans, spans[1:]):
        if a1 < b0:
            msg = f"{f}: 'fields' {n0!r} [{a0}, {b0}) and {n1!r} overlap at column {a1}"
            raise _error(msg)
    names = [s[2] for s in spans]
    if len(set(names)) != len(names):
        msg = f"{f}: 'fields' names a field twice ({names})"
        raise _error(msg)


def _check_scales(f: Path, scales: dict, width: int | None) -> None:
    for key in ("target_mean", "target_std"):
        if key not in scales:
            continue
        v = scales[key]
        if not isinstance(v, list) or not all(_finite_numbers(x) for x in v):
            msg = f"{f}: 'scales.{key}' must be a list of finite numbers, got {str(v)[:80]}"
            raise _error(msg)
        if width is not None and len(v) != width:
            msg = f"{f}: 'scales.{key}' has {len(v)} values for {width} output columns"
            raise _error(msg)
        if key == "target_std" and any(float(x) <= 0 for x in v):
            msg = f"{f}: 'scales.target_std' must be > 0 in every column, got {v}"
            raise _error(msg)
    if ("target_mean" in scales) != ("target_std" in scales):
        msg = f"{f}: 'scales' has one of target_mean/target_std without the other"
        raise _error(msg)
    lo, hi = FLOW_RANGE
    for key in ("u_inf", "rho"):
        v = scales.get(key)
        if v is not None and not (_finite_numbers(v) and lo <= float(v) <= hi):
            msg = f"{f}: 'scales.{key}' = {v!r} must be a finite number in [{lo:g}, {hi:g}]"
            raise _error(msg)
    ds = scales.get("dataset", {})
    if not isinstance(ds, dict):
        msg = f"{f}: 'scales.dataset' must be a dict of field -> factor"
        raise _error(msg)
    for name, v in ds.items():
        if not (_finite_numbers(v) and float(v) > 0):
            msg = f"{f}: 'scales.dataset.{name}' = {v!r} must be a finite number > 0"
            raise _error(msg)


def check_meta(f: Path, meta: dict) -> None:
    """``fields``, ``scales`` and ``inputs`` of ``model.json`` (``f``) against each other and
    the config's output width (see the module notes)."""
    width = output_width(meta["config"])
    _check_fields(f, meta["fields"], width)
    _check_scales(f, meta["scales"], width)
    knn = meta["inputs"].get("knn")
    if "knn" in meta["inputs"] and (isinstance(knn, bool) or not isinstance(knn, int)
                                    or knn < 1):
        msg = f"{f}: 'inputs.knn' = {knn!r} must be an int >= 1"
        raise _error(msg)


def check_for_inference(path: Path | None, scales: dict) -> None:
    """What predict and evaluate also need: the target standardisation."""
    for key in ("target_mean", "target_std"):
        if key not in scales:
            msg = f"{path}: 'scales.{key}' missing from model.json; predict de-standardises " \
                  "the model's output with it (export the model with target_mean/target_std)"
            raise _error(msg)


def meta_state(path: Path, cls: type, name: str, config: dict) -> dict[str, torch.Tensor]:
    """The state dict of ``cls(**config)`` built on the meta device: shapes and dtypes, no
    storage."""
    try:
        with torch.device("meta"):
            model = cls(**config)
    except Exception as exc:  # any constructor error: the config does not fit the class
        msg = f"{path}: config does not fit {name} ({type(exc).__name__}: {str(exc)[:200]})"
        raise _error(msg) from None
    return model.state_dict()


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def check_declared(path: Path, name: str, want: dict[str, torch.Tensor], declared: Any,
                   weights_size: int) -> None:
    """The tensors ``model.json`` declares (name -> [shape, dtype]) against the class's (built
    on the meta device), and their bytes against the weights file's size."""
    f = path / "model.json"
    for k, v in declared.items():
        ok = (isinstance(v, list) and len(v) == 2 and isinstance(v[0], list)
              and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v[0])
              and isinstance(v[1], str))
        if not ok:
            msg = f"{f}: 'tensors'[{k!r}] = {str(v)[:80]} must be [shape, dtype]"
            raise _error(msg)
    problem = shape_mismatch({k: tuple(v[0]) for k, v in declared.items()},
                             {k: tuple(t.shape) for k, t in want.items()})
    if problem:
        msg = (f"{f}: weights are not those of a {name} with this config (as model.json "
               f"declares them): {problem}")
        raise _error(msg)
    for k, t in want.items():
        if declared[k][1] != _dtype_name(t):
            msg = f"{f}: tensor {k!r} is declared {declared[k][1]}; a {name} holds {_dtype_name(t)}"
            raise _error(msg)
    need = sum(t.numel() * t.element_size() for t in want.values())
    if need > weights_size:
        msg = (f"{f}: the config describes {need:,} bytes of weights, the weights file has "
               f"{weights_size:,}; the config or the weights file is wrong")
        raise _error(msg)


def check_weights(wfile: Path, state: dict[str, torch.Tensor], declared: dict) -> None:
    """The tensors read from ``wfile``: dtype as declared (no silent cast), finite values."""
    for k, t in state.items():
        want = declared.get(k, [None, None])[1]
        if want is not None and _dtype_name(t) != want:
            msg = (f"{wfile}: tensor {k!r} is stored as {_dtype_name(t)}, model.json declares "
                   f"{want}; the weights file was not written with this model.json")
            raise _error(msg)
        if t.is_floating_point() or t.is_complex():
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                msg = (f"{wfile}: tensor {k!r} has {bad} NaN/inf value(s) of {t.numel()} (a "
                       "diverged run?); export weights from a finite checkpoint")
                raise _error(msg)
