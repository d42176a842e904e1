"""Reference models in plain torch (no ShardTensor imports)."""

from meshshard.models.transolver import MLP, PhysicsAttention, Transolver, TransolverBlock
from meshshard.models.unet import UNet3d
from meshshard.models.vit import ViT

__all__ = ["MLP", "PhysicsAttention", "Transolver", "TransolverBlock", "UNet3d", "ViT"]
