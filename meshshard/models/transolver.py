"""A Transolver for irregular meshes (Wu et al., ICML 2024), in plain torch.

Points carry coordinates and features; Physics-Attention assigns every point soft weights over
``slices`` (softmax over slices), forms slice tokens as weighted means over points, runs
attention among the slice tokens, and de-slices back to the points. Nothing here knows about
ShardTensor: run it on ShardTensors sharded along the point dim and the reductions over points
become all-reduces by themselves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLP", "PhysicsAttention", "Transolver", "TransolverBlock"]


class MLP(nn.Module):
    def __init__(self, n_in: int, n_hidden: int, n_out: int, n_layers: int = 1) -> None:
        super().__init__()
        self.pre = nn.Linear(n_in, n_hidden)
        self.hidden = nn.ModuleList(nn.Linear(n_hidden, n_hidden) for _ in range(n_layers))
        self.post = nn.Linear(n_hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.pre(x))
        for layer in self.hidden:
            x = x + F.gelu(layer(x))
        return self.post(x)


class PhysicsAttention(nn.Module):
    """Physics-Attention over irregular points.

    Input and output: (B, N, C). Per layer it reduces over the N points twice (slice weight
    sums and slice tokens, both (B, H, S, ·)), so domain-parallel communication per layer does
    not grow with N.
    """

    def __init__(
        self, dim: int, heads: int = 4, dim_head: int = 16, slices: int = 32, dropout: float = 0.0
    ) -> None:
        super().__init__()
        inner = heads * dim_head
        self.heads, self.dim_head = heads, dim_head
        self.scale = dim_head**-0.5
        self.temperature = nn.Parameter(torch.full((1, heads, 1, 1), 0.5))
        self.in_project_x = nn.Linear(dim, inner)
        self.in_project_fx = nn.Linear(dim, inner)
        self.in_project_slice = nn.Linear(dim_head, slices)
        nn.init.orthogonal_(self.in_project_slice.weight)
        self.to_q = nn.Linear(dim_head, dim_head, bias=False)
        self.to_k = nn.Linear(dim_head, dim_head, bias=False)
        self.to_v = nn.Linear(dim_head, dim_head, bias=False)
        self.to_out = nn.Linear(inner, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        H, D = self.heads, self.dim_head
        fx_mid = self.in_project_fx(x).reshape(B, N, H, D).permute(0, 2, 1, 3)  # B H N D
        x_mid = self.in_project_x(x).reshape(B, N, H, D).permute(0, 2, 1, 3)  # B H N D
        logits = self.in_project_slice(x_mid) / self.temperature.clamp(min=1e-2)
        slice_weights = torch.softmax(logits, dim=-1)  # B H N S
        slice_norm = slice_weights.sum(dim=2)  # B H S      (sum over points)
        slice_token = torch.einsum("bhnd,bhns->bhsd", fx_mid, slice_weights)  # (sum over points)
        slice_token = slice_token / (slice_norm + 1e-5).unsqueeze(-1)
        q, k, v = self.to_q(slice_token), self.to_k(slice_token), self.to_v(slice_token)
        attn = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
        attn = self.dropout(attn)
        out_token = torch.matmul(attn, v)  # B H S D
        out_x = torch.einsum("bhsd,bhns->bhnd", out_token, slice_weights)  # B H N D
        out_x = out_x.permute(0, 2, 1, 3).reshape(B, N, H * D)
        return self.to_out(out_x)

    # Chunked inference: ``forward(x) == reduction_finish(x, reduction_partial(x))``, and
    # ``reduction_partial`` is a sum over the points, so the sums of chunks of x add up to the
    # whole's (meshshard.apps.chunked uses this; forward itself stays as above).
    def _slices(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, N, _ = x.shape
        H, D = self.heads, self.dim_head
        fx_mid = self.in_project_fx(x).reshape(B, N, H, D).permute(0, 2, 1, 3)
        x_mid = self.in_project_x(x).reshape(B, N, H, D).permute(0, 2, 1, 3)
        logits = self.in_project_slice(x_mid) / self.temperature.clamp(min=1e-2)
        return fx_mid, torch.softmax(logits, dim=-1)

    def reduction_partial(self, x: torch.Tensor) -> torch.Tensor:
        """Sums over the points of ``x`` (B, N, C): (B, H, S, 1 + D) = [weight sums, tokens]."""
        fx_mid, w = self._slices(x)
        return torch.cat([w.sum(dim=2).unsqueeze(-1),
                          torch.einsum("bhnd,bhns->bhsd", fx_mid, w)], dim=-1)

    def reduction_finish(self, x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        """The output for the points of ``x`` given the sums over *all* points."""
        B, N, _ = x.shape
        _, w = self._slices(x)
        slice_token = total[..., 1:] / (total[..., 0] + 1e-5).unsqueeze(-1)
        q, k, v = self.to_q(slice_token), self.to_k(slice_token), self.to_v(slice_token)
        attn = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
        out_token = torch.matmul(self.dropout(attn), v)
        out_x = torch.einsum("bhsd,bhns->bhnd", out_token, w)
        return self.to_out(out_x.permute(0, 2, 1, 3).reshape(B, N, self.heads * self.dim_head))


class TransolverBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, slices: int, mlp_ratio: int = 2,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = PhysicsAttention(dim, heads, dim_head, slices, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, dim * mlp_ratio, dim, n_layers=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transolver(nn.Module):
    """Coordinates (B, N, space_dim) and features (B, N, fun_dim) -> fields (B, N, out_dim)."""

    def __init__(
        self,
        space_dim: int = 3,
        fun_dim: int = 0,
        out_dim: int = 1,
        n_hidden: int = 64,
        n_layers: int = 2,
        heads: int = 4,
        slices: int = 32,
        mlp_ratio: int = 2,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if n_hidden % heads:
            msg = f"n_hidden={n_hidden} must be divisible by heads={heads}"
            raise ValueError(msg)
        self.fun_dim = fun_dim
        self.preprocess = MLP(space_dim + fun_dim, n_hidden * 2, n_hidden, n_layers=0)
        self.placeholder = nn.Parameter(torch.rand(n_hidden) / n_hidden)
        self.blocks = nn.ModuleList(
            TransolverBlock(n_hidden, heads, n_hidden // heads, slices, mlp_ratio, dropout)
            for _ in range(n_layers)
        )
        self.ln_out = nn.LayerNorm(n_hidden)
        self.head = nn.Linear(n_hidden, out_dim)

    def forward(self, coords: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        x = coords if features is None else torch.cat([coords, features], dim=-1)
        x = self.preprocess(x) + self.placeholder
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_out(x))
