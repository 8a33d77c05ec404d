"""Embeddings for /v1/embeddings and /api/embed: ``Engine.embed`` (the mean of the model's INPUT
token embeddings, L2-normalised: which tokens a text holds, not their context) and OpenAI's base64
encoding. The engine reads weights only, so this runs on a worker thread beside the engine loop.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence

from nxctl.server.host import SeatModel


def embed(model: SeatModel, token_lists: Sequence[Sequence[int]]) -> list[list[float]]:
    """One unit-length vector (hidden_size floats) per token list (the engine computes them)."""
    return model.llm.engine.embed(token_lists)


def as_base64(vector: Sequence[float]) -> str:
    """OpenAI's ``encoding_format: base64``: little-endian float32 bytes, base64-encoded."""
    data = struct.pack(f"<{len(vector)}f", *vector)
    return base64.b64encode(data).decode("ascii")
