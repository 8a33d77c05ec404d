"""The int8 KV cache's shape, without torch (planning commands count its bytes): each token's head vector
of d values in groups of GROUP, one float16 scale a group (engine/kv/int8.py quantizes)."""

from __future__ import annotations

GROUP = 32  # values per scale


def groups(head_dim: int) -> int:
    """Scales per token and KV head."""
    return -(-head_dim // GROUP)


def bytes_per_value(head_dim: int) -> float:
    """What one cached value costs with its share of the scales (1 + 2 / 32 bytes for head_dim 64)."""
    return (head_dim + 2 * groups(head_dim)) / head_dim
