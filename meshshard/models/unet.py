"""A small 3-D UNet in plain torch (no meshshard imports).

Run on a ShardTensor sharded along one or two spatial dims, every layer (conv with halos, max
pooling, transposed conv, group/batch norm with global statistics, channel concatenation of
the skip connections) follows meshshard's grid rules, so the same module is domain-parallel.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ConvBlock", "UNet3d"]


class ConvBlock(nn.Module):
    """Two (conv3d 3x3x3 -> norm -> GELU) layers."""

    def __init__(self, c_in: int, c_out: int, norm: str = "group",
                 padding_mode: str = "zeros") -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in ((c_in, c_out), (c_out, c_out)):
            layers.append(nn.Conv3d(a, b, 3, padding=1, padding_mode=padding_mode))
            if norm == "group":
                layers.append(nn.GroupNorm(min(4, b), b))
            elif norm == "batch":
                layers.append(nn.BatchNorm3d(b))
            elif norm == "instance":
                layers.append(nn.InstanceNorm3d(b, affine=True))
            layers.append(nn.GELU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class UNet3d(nn.Module):
    """Encoder (ConvBlock, MaxPool3d(2)) x depth, decoder (ConvTranspose3d(2, stride 2), concat
    with the skip, ConvBlock), 1x1x1 head.

    Parameters
    ----------
    in_channels, out_channels : int
    base : int
        Channels of the first level; level ``i`` has ``base * 2**i``.
    depth : int
        Number of levels; spatial sizes must be divisible by ``2**(depth - 1)``.
    norm : {"group", "batch", "instance"}

    Example
    -------
    >>> net = UNet3d(1, 2, base=4, depth=2)
    >>> net(torch.randn(1, 1, 8, 8, 8)).shape
    torch.Size([1, 2, 8, 8, 8])
    """

    def __init__(self, in_channels: int = 1, out_channels: int = 1, base: int = 8,
                 depth: int = 3, norm: str = "group", padding_mode: str = "zeros") -> None:
        super().__init__()
        chans = [base * 2**i for i in range(depth)]
        self.enc = nn.ModuleList()
        c = in_channels
        for ch in chans:
            self.enc.append(ConvBlock(c, ch, norm, padding_mode))
            c = ch
        self.pool = nn.MaxPool3d(2)
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for ch in reversed(chans[:-1]):
            self.up.append(nn.ConvTranspose3d(c, ch, 2, stride=2))
            self.dec.append(ConvBlock(2 * ch, ch, norm, padding_mode))
            c = ch
        self.head = nn.Conv3d(c, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.enc):
            x = block(x)
            if i < len(self.enc) - 1:
                skips.append(x)
                x = self.pool(x)
        for up, block in zip(self.up, self.dec):
            x = up(x)
            x = block(torch.cat([skips.pop(), x], dim=1))
        return self.head(x)
