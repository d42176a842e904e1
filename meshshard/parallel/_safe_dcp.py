"""Reading DCP checkpoints without executing anything from them.

torch's ``FileSystemReader.read_metadata`` reads ``.metadata`` with a plain ``pickle.load``, and
``DefaultLoadPlanner.load_bytes`` reads every non-tensor item with ``torch.load(...,
weights_only=False)``: a crafted checkpoint directory runs its author's code on load. This module
replaces both: :class:`SafeReader` unpickles ``.metadata`` admitting only the classes DCP itself
writes there (its metadata dataclasses, ``torch.Size``, dtypes, layouts, paths), and
:class:`SafePlanner` reads non-tensor items with ``weights_only=True`` (tensor items are already
read that way by torch). Anything else is refused with :class:`UnsafeCheckpoint`, naming the file
and the object it wanted.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from meshshard.errors import StoreError

__all__ = ["SafePlanner", "SafeReader", "UnsafeCheckpoint", "read_metadata"]

_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "BytesStorageMetadata", "ChunkStorageMetadata", "Metadata", "MetadataIndex",
        "StorageMeta", "TensorProperties", "TensorStorageMetadata", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}  # fmt: skip


class UnsafeCheckpoint(StoreError):
    """A checkpoint file that would execute code (or build objects DCP never writes) on load."""


class _Restricted(pickle.Unpickler):
    def __init__(self, fh, path: Path) -> None:
        super().__init__(fh)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        msg = (
            f"{self.path}: refused to load: it asks for {module}.{name}, which is not part of "
            "DCP checkpoint metadata (a crafted or foreign file; nothing from it was run)"
        )
        raise UnsafeCheckpoint(msg)


def read_metadata(path: str | Path) -> Metadata:
    """The ``Metadata`` in file ``path`` (a DCP ``.metadata``), unpickled with only DCP's own
    metadata classes admitted.

    Raises
    ------
    UnsafeCheckpoint
        The file asks for any other global (the message names it); nothing of it was run.
    ValueError
        The file is not a readable pickle of a ``Metadata``.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        try:
            meta = _Restricted(fh, path).load()
        except UnsafeCheckpoint:
            raise
        except Exception as exc:  # truncated or garbage pickles raise many types
            msg = f"{path}: corrupt checkpoint metadata ({type(exc).__name__}: {exc})"
            raise ValueError(msg) from None
    if not isinstance(meta, Metadata):
        msg = f"{path}: checkpoint metadata is a {type(meta).__name__}, not DCP Metadata"
        raise ValueError(msg)
    return meta


class SafeReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is read by :func:`read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        meta = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


class SafePlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that reads non-tensor items with ``torch.load(weights_only=True)``
    (plain Python values and tensors only; no code from the file). ``path`` names the
    checkpoint in errors."""

    def __init__(self, path: str | Path = "checkpoint", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = Path(path)

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if "Unsupported global" in ln]
            why = (lines[0] if lines else str(exc).splitlines()[0]).split(" was not")[0]
            msg = (
                f"{self.path}: checkpoint item {read_item.dest_index.fqn!r} refused: it is not "
                f"plain data ({why}); nothing from it was run"
            )
            raise UnsafeCheckpoint(msg) from None
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
