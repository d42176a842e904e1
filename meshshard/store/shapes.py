"""What differs between the tensors a checkpoint holds and the ones a model expects: the one
comparison behind every "checkpoint of another model" error (DCP checkpoints, model files)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["shape_mismatch"]


def shape_mismatch(saved: Mapping[str, Sequence[int]], want: Mapping[str, Sequence[int]],
                   *, examples: int = 3) -> str | None:
    """``None`` when ``saved`` and ``want`` (tensor name -> shape) agree; otherwise one line:
    the tensors missing from the checkpoint, the ones the model does not have, and those of
    other shapes, each with up to ``examples`` names."""
    missing = sorted(set(want) - set(saved))
    unexpected = sorted(set(saved) - set(want))
    shape = sorted(k for k in set(want) & set(saved) if list(want[k]) != list(saved[k]))
    parts = []
    if missing:
        parts.append(f"{len(missing)} tensors missing from it (e.g. {missing[:examples]})")
    if unexpected:
        parts.append(f"{len(unexpected)} tensors this model does not have "
                     f"(e.g. {unexpected[:examples]})")
    if shape:
        k = shape[0]
        parts.append(f"{len(shape)} with other shapes (e.g. {k}: checkpoint {list(saved[k])}, "
                     f"model {list(want[k])})")
    return "; ".join(parts) or None
