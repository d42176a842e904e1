"""Reference models in plain torch (no ShardTensor imports)."""

from meshshard.models.domino import DoMINO, LocalOps
from meshshard.models.meshgraphnet import FullGraph, MeshGraphNet
from meshshard.models.point_transformer import (
    CrossAttentionBlock,
    PointTransformer,
    SelfAttentionBlock,
)
from meshshard.models.transolver import MLP, PhysicsAttention, Transolver, TransolverBlock
from meshshard.models.unet import UNet3d
from meshshard.models.vit import ViT

__all__ = [
    "MLP",
    "CrossAttentionBlock",
    "DoMINO",
    "FullGraph",
    "LocalOps",
    "MeshGraphNet",
    "PhysicsAttention",
    "PointTransformer",
    "SelfAttentionBlock",
    "Transolver",
    "TransolverBlock",
    "UNet3d",
    "ViT",
]
