"""Rotary position embeddings (rotate-half layout), tables computed once per engine."""

from __future__ import annotations

import math

import torch

from engine.model_config import RopeScaling


def inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None = None, context: int = 0
) -> torch.Tensor:
    """[head_dim / 2] float32 rotation frequencies, stretched as ``scaling`` says (as Hugging Face does);
    ``context``: the longest sequence served (longrope picks its factors by it)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if scaling is not None and scaling.kind == "longrope":
        long = context > scaling.original_max_position_embeddings
        factors = torch.tensor(scaling.long_factor if long else scaling.short_factor, dtype=torch.float32)
        return 1.0 / (factors * theta**exponents)
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.kind == "yarn":
        return _yarn(inv_freq, head_dim, theta, scaling)
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "divisors":
        return inv_freq / torch.tensor(scaling.divisors, dtype=torch.float32)
    # llama3: long wavelengths slowed by ``factor``, short ones kept, those between blended
    old = scaling.original_max_position_embeddings
    low_wavelen, high_wavelen = old / scaling.low_freq_factor, old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    between = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(between, blended, scaled)


def _yarn(inv_freq: torch.Tensor, head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """YaRN: frequency i kept (extrapolated) when it turns often over the original context, divided
    by ``factor`` (interpolated) when it turns rarely, blended along a linear ramp between."""
    old = scaling.original_max_position_embeddings

    def dimension_turning(turns: float) -> float:  # the dimension whose frequency turns ``turns`` times
        return head_dim * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension_turning(scaling.beta_fast), dimension_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    return (inv_freq / scaling.factor) * (1 - keep) + inv_freq * keep


BLOCK_POSITIONS = 4096  # positions whose cos/sin rows are computed together (Rope._grow)


class Rope:
    """cos/sin tables for positions up to ``max_positions``, [positions, head_dim] each, computed as steps
    first reach them: in blocks of BLOCK_POSITIONS positions, each block always computed alone from its
    own positions, so a position's values depend on the position alone, never on how far the table had
    grown (a 131072-position context's full tables would hold 134 MB at head_dim 128)."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        max_positions: int,
        device: torch.device,
        scaling: RopeScaling | None = None,
    ):
        self.inv_freq = inverse_frequencies(head_dim, theta, scaling, max_positions)  # [head_dim / 2]
        self.gain = scaling.attention_factor if scaling is not None else 1.0
        self.max_positions, self.device = max_positions, device
        self.cos = torch.empty(0, head_dim, device=device)  # [positions computed, head_dim]
        self.sin = torch.empty(0, head_dim, device=device)

    def _grow(self, needed: int) -> None:
        """Compute the blocks up to the one holding position ``needed - 1`` (mutates)."""
        blocks_cos, blocks_sin = [self.cos], [self.sin]
        for start in range(self.cos.shape[0], min(needed, self.max_positions), BLOCK_POSITIONS):
            end = min(start + BLOCK_POSITIONS, self.max_positions)
            freqs = torch.arange(start, end, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)  # [block, head_dim]
            blocks_cos.append((emb.cos() * self.gain).to(self.device))
            blocks_sin.append((emb.sin() * self.gain).to(self.device))
        self.cos, self.sin = torch.cat(blocks_cos), torch.cat(blocks_sin)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows for positions [T]: [T, 1, head_dim] each (compute once per step, use per layer)."""
        if positions.numel():
            needed = int(positions.max()) + 1
            if needed > self.cos.shape[0]:
                self._grow(needed)
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, heads, head_dim]; cos, sin: [T, 1, head_dim] -> [T, heads, head_dim]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)
