"""Partitioners for unstructured meshes and point clouds, and the record of a cut.

Front door: :func:`partition` (``method="hilbert" | "morton" | "rcb" | "metis" | "kaminpar" |
"hypergraph"``). Every
method takes per-point ``weights`` and per-shard ``targets`` and returns a :class:`Partition`.
Heavy pieces (scipy.sparse graphs, pymetis, pyvista) load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from meshshard.partition.api import partition
from meshshard.partition.methods import list_methods, method_info, register_method
from meshshard.partition.rcb import rcb
from meshshard.partition.record import SCHEMA_VERSION, HaloPlan, Partition
from meshshard.partition.sfc import hilbert, hilbert_codes, morton, morton_codes

_LAZY = {
    "metis": "meshshard.partition.graphpart",
    "knn_graph": "meshshard.partition.graph",
    "dual_graph": "meshshard.partition.graph",
    "weld_points": "meshshard.partition.weld",
    "metrics": "meshshard.partition.quality",
    "refine_volume": "meshshard.partition.volrefine",
    "communication_volume": "meshshard.partition.volrefine",
    "refine_volume_fast": "meshshard.partition.fastrefine",
    "halo_plan": "meshshard.partition.halo",
    "ghost_rows": "meshshard.partition.halo",
    "hypergraph": "meshshard.partition.hypergraph",
    "halo_plan_graph": "meshshard.partition.halo",
    "halo_plan_radius": "meshshard.partition.halo",
    "read_points": "meshshard.partition.io",
    "read_mesh": "meshshard.partition.io",
    # collectives over torch.distributed (imported on first use only)
    "partition_distributed": "meshshard.partition.distributed",
    "redistribute_rows": "meshshard.partition.distributed",
    "halo_plan_radius_distributed": "meshshard.partition.distributed",
    "halo_plan_graph_distributed": "meshshard.partition.distributed",
    "DistributedPartition": "meshshard.partition.distributed",
}

__all__ = [
    "SCHEMA_VERSION",
    "HaloPlan",
    "Partition",
    "hilbert",
    "hilbert_codes",
    "list_methods",
    "method_info",
    "morton",
    "morton_codes",
    "rcb",
    "partition",
    "register_method",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module 'meshshard.partition' has no attribute {name!r}"
    raise AttributeError(msg)
