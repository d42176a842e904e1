"""Reference models in plain torch (no ShardTensor imports)."""

from meshshard.models.meshgraphnet import FullGraph, MeshGraphNet
from meshshard.models.transolver import MLP, PhysicsAttention, Transolver, TransolverBlock

__all__ = ["MLP", "FullGraph", "MeshGraphNet", "PhysicsAttention", "Transolver", "TransolverBlock"]
