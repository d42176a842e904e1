"""A ViT-style encoder-decoder for grids in plain torch (no meshshard imports): patch
embedding (a conv whose stride equals its kernel), transformer blocks with
``F.scaled_dot_product_attention``, and unpatchify back to the grid.

Domain-parallel on an image sharded along its rows: the patch embedding gives tokens sharded
along the token dim (``flatten(2).transpose(1, 2)``), the blocks are pointwise in the tokens
except attention (ring attention over sharded tokens), and unpatchify returns the sharded grid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ViT", "ViTBlock"]


class ViTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)); x + mlp(ln(x))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Patch embed -> blocks -> per-token head -> unpatchify.

    Parameters
    ----------
    in_channels, out_channels : int
    image_size : (H, W), divisible by ``patch``
    patch : int
    dim, depth, heads : transformer width, number of blocks, attention heads

    Example
    -------
    >>> net = ViT(2, 1, (16, 8), patch=4, dim=16, depth=1, heads=2)
    >>> net(torch.randn(1, 2, 16, 8)).shape
    torch.Size([1, 1, 16, 8])
    """

    def __init__(self, in_channels: int = 3, out_channels: int = 3,
                 image_size: tuple[int, int] = (32, 32), patch: int = 4, dim: int = 32,
                 depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.patch, self.out_channels = patch, out_channels
        hp, wp = image_size[0] // patch, image_size[1] // patch
        self.embed = nn.Conv2d(in_channels, dim, patch, stride=patch)
        self.pos = nn.Parameter(torch.randn(1, hp * wp, dim) * 0.02)
        self.blocks = nn.ModuleList(ViTBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, patch * patch * out_channels)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, H/p * W/p, dim) tokens in row-major patch order."""
        return self.embed(x).flatten(2).transpose(1, 2) + self.pos

    def unpatchify(self, t: torch.Tensor, hp: int, wp: int) -> torch.Tensor:
        b, p, c = t.shape[0], self.patch, self.out_channels
        t = t.reshape(b, hp, wp, p, p, c).permute(0, 5, 1, 3, 2, 4)
        return t.reshape(b, c, hp * p, wp * p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hp, wp = x.shape[2] // self.patch, x.shape[3] // self.patch
        t = self.tokens(x)
        for blk in self.blocks:
            t = blk(t)
        return self.unpatchify(self.head(self.norm(t)), hp, wp)
