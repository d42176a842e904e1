"""Reference models in plain torch (no ShardTensor imports)."""

from meshshard.models.transolver import MLP, PhysicsAttention, Transolver, TransolverBlock

__all__ = ["MLP", "PhysicsAttention", "Transolver", "TransolverBlock"]
