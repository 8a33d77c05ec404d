"""Embeddings from the model's INPUT token-embedding table, mean-pooled over the text's tokens and
L2-normalised (the engine exposes no hidden states, so these are not final-hidden-state embeddings:
they capture which tokens a text holds, not their context).

Read-only access to the weights, so this runs on a worker thread beside the engine loop.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import torch

from nxctl.server.host import SeatModel

EMBED_WEIGHT = "model.embed_tokens.weight"


def embed(model: SeatModel, token_lists: Sequence[Sequence[int]]) -> list[list[float]]:
    """One unit-length vector (hidden_size floats) per token list."""
    table = model.llm.engine.model.weight(EMBED_WEIGHT)  # [vocab, hidden]
    vectors = []
    with torch.no_grad():
        for ids in token_lists:
            rows = table[
                torch.tensor(list(ids), dtype=torch.long, device=table.device)
            ].float()  # [n, hidden]
            mean = rows.mean(dim=0)
            vectors.append(torch.nn.functional.normalize(mean, dim=0).cpu().tolist())
    return vectors


def as_base64(vector: Sequence[float]) -> str:
    """OpenAI's ``encoding_format: base64``: little-endian float32 bytes, base64-encoded."""
    data = torch.tensor(list(vector), dtype=torch.float32).numpy().astype("<f4").tobytes()
    return base64.b64encode(data).decode("ascii")
