"""Optional backends, detected once at import (never per call)."""

from __future__ import annotations

try:  # pragma: no cover - torch_cluster is not installed on the CI machines
    import torch_cluster as _torch_cluster

    WITH_CLUSTER = True
except Exception:  # ImportError, or a broken binary build (OSError / RuntimeError)
    _torch_cluster = None
    WITH_CLUSTER = False

__all__ = ["WITH_CLUSTER", "require_cluster"]


def require_cluster():
    """Return the ``torch_cluster`` module or raise an ImportError saying how to get it."""
    if not WITH_CLUSTER:
        msg = (
            "backend='cluster' needs torch_cluster, which is not installed; "
            "in the meshshard checkout run `pip install -e '.[cluster]'` (it compiles from "
            "source, ~30 min on CPU) or use backend='kdtree' / 'brute' / 'auto'"
        )
        raise ImportError(msg)
    return _torch_cluster
