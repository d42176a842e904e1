"""A point transformer with global attention, in plain torch.

Points carry coordinates and features. A per-point MLP embeds them into tokens; each block runs
multi-head self-attention over *all* point tokens (``F.scaled_dot_product_attention``) and a
per-point MLP, both pre-norm with residuals. An optional decoder embeds a second set of query
points and lets them cross-attend to the encoded tokens (``nn.MultiheadAttention``), the
AB-UPT / anchor-attention pattern: surface or probe points reading a volume or geometry encoding.

Nothing here knows about ShardTensor: run it on ShardTensors sharded along the point dim (points
and query points in any, different, uneven layouts) and the attention becomes exact ring
attention by itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CrossAttentionBlock", "PointTransformer", "SelfAttentionBlock"]


class _FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SelfAttentionBlock(nn.Module):
    """Pre-norm global self-attention over point tokens + per-point MLP. (B, N, C) -> same."""

    def __init__(self, dim: int, heads: int = 4, mlp_ratio: float = 2.0,
                 causal: bool = False) -> None:
        super().__init__()
        if dim % heads:
            msg = f"dim={dim} must be divisible by heads={heads}"
            raise ValueError(msg)
        self.heads, self.causal = heads, causal
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = _FeedForward(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``key_padding_mask``: (B, N) bool, True where a point must be ignored as a key."""
        B, N, C = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(B, N, 3, self.heads, C // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, N, C / H)
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        x = x + self.proj(a.transpose(1, 2).reshape(B, N, C))
        return x + self.mlp(self.norm2(x))


class CrossAttentionBlock(nn.Module):
    """Query tokens (B, M, C) attend to context tokens (B, N, C) with ``nn.MultiheadAttention``,
    then a per-point MLP. Returns (B, M, C)."""

    def __init__(self, dim: int, heads: int = 4, mlp_ratio: float = 2.0) -> None:
        super().__init__()
        self.norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = _FeedForward(dim, int(dim * mlp_ratio))

    def forward(self, q: torch.Tensor, ctx: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        kv = self.norm_kv(ctx)
        a, _ = self.attn(self.norm_q(q), kv, kv, key_padding_mask=key_padding_mask,
                         need_weights=False)
        q = q + a
        return q + self.mlp(self.norm2(q))


class PointTransformer(nn.Module):
    """Global-attention point transformer with an optional cross-attention decoder.

    Parameters
    ----------
    in_dim : int
        Features per input point (coordinates included).
    out_dim : int
        Outputs per point (per query point when ``query_dim`` is set).
    dim, heads, depth, mlp_ratio : model width, attention heads, self-attention blocks, MLP
        expansion.
    query_dim : int, optional
        Features per query point; enables the decoder (``forward(x, queries)``).
    causal : bool
        Causal self-attention in token order (e.g. points ordered along a curve).

    Example
    -------
    >>> model = PointTransformer(in_dim=4, out_dim=2, dim=32, heads=4, depth=2, query_dim=3)
    >>> x, qp = torch.randn(1, 100, 4), torch.randn(1, 30, 3)
    >>> model(x, qp).shape
    torch.Size([1, 30, 2])
    """

    def __init__(self, in_dim: int, out_dim: int, *, dim: int = 64, heads: int = 4,
                 depth: int = 2, mlp_ratio: float = 2.0, query_dim: int | None = None,
                 causal: bool = False) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(in_dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(SelfAttentionBlock(dim, heads, mlp_ratio, causal)
                                    for _ in range(depth))
        self.query_embed = None
        self.cross = None
        if query_dim is not None:
            self.query_embed = nn.Sequential(nn.Linear(query_dim, dim), nn.GELU(),
                                             nn.Linear(dim, dim))
            self.cross = CrossAttentionBlock(dim, heads, mlp_ratio)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, out_dim)

    def forward(self, x: torch.Tensor, queries: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: (B, N, in_dim); ``queries``: (B, M, query_dim) or None; ``key_padding_mask``:
        (B, N) bool, True for padding points. Returns (B, N, out_dim) or (B, M, out_dim)."""
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, key_padding_mask)
        if queries is not None:
            if self.cross is None:
                msg = "this PointTransformer has no decoder: build it with query_dim=..."
                raise ValueError(msg)
            h = self.cross(self.query_embed(queries), h, key_padding_mask)
        return self.head(self.norm(h))
