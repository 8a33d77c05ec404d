"""The int8 KV cache's shape, without torch (planning commands count its bytes): each token's head vector
of d values in groups of GROUP, one float16 scale a group (engine/kv/int8.py quantizes)."""

from __future__ import annotations

GROUP = 32  # values per scale


def groups(head_dim: int) -> int:
    """Scales per token and KV head."""
    return -(-head_dim // GROUP)
