"""Rotary position embeddings (rotate-half layout), tables computed once per engine."""

from __future__ import annotations

import torch


class Rope:
    """cos/sin tables for every position up to ``max_positions``: [max_positions, head_dim] each."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, device: torch.device):
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)  # [P, head_dim]
        self.cos = emb.cos().to(device)
        self.sin = emb.sin().to(device)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows for positions [T]: [T, 1, head_dim] each (compute once per step, use per layer)."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, heads, head_dim]; cos, sin: [T, 1, head_dim] -> [T, heads, head_dim]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)
