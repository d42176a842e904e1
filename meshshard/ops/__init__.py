"""meshshard.ops: exact distributed neighbour ops on uneven shards.

Public API (ShardTensors, or local Tensors with ``group=``): :func:`knn`, :func:`radius`,
:func:`knn_chunks` (the same kNN, queries streamed chunk by chunk), :func:`knn_graph`,
:func:`radius_graph`, :func:`halo_exchange`, :func:`gather_neighbors`,
:func:`scatter_to_owners`. The lower layer on local tensors is :mod:`meshshard.ops.functional`
and :mod:`meshshard.ops.halo`; local kernels are in :mod:`meshshard.ops.kernels`.
"""

from meshshard.ops._backends import WITH_CLUSTER
from meshshard.ops.api import (
    gather_neighbors,
    halo_exchange,
    knn,
    knn_graph,
    radius,
    radius_graph,
    scatter_to_owners,
)
from meshshard.ops.grid import grid_gather, grid_scatter
from meshshard.ops.gridpoint import GridLayout, grid_knn, grid_radius
from meshshard.ops.gridsample import grid_sample
from meshshard.ops.knn_chunks import knn_chunks
from meshshard.ops.sdf import ShardedSurface, grid_sdf, signed_distance

__all__ = [
    "GridLayout",
    "ShardedSurface",
    "WITH_CLUSTER",
    "gather_neighbors",
    "grid_gather",
    "grid_knn",
    "grid_radius",
    "grid_sample",
    "grid_sdf",
    "grid_scatter",
    "halo_exchange",
    "knn",
    "knn_chunks",
    "knn_graph",
    "radius",
    "radius_graph",
    "scatter_to_owners",
    "signed_distance",
]
