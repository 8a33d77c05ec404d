"""A seed for every generation request the Ray seat's ingress relays, so that any request can be replayed.

A request that samples without a seed draws its randomness at the replica; the same request sent again,
or retried on another replica, would sample differently. The ingress gives each chat or completion
request that names no seed one of its own before routing (OpenAI's ``seed``, Ollama's ``options.seed``)
and says which in the response header ``x-nxctl-seed``: sent again with that seed, on any replica and
in any batch, the request gets the same answer, bit for bit (batch invariance). A request that names its
seed is relayed as it came. Bodies that are not a JSON object are left as they are (the replica answers
them with its 400).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

SEED_HEADER = "x-nxctl-seed"
SEED_BOUND = 2**31  # seeds drawn from [0, 2**31): every client's integer type holds them
# the generation endpoints and where each keeps its seed: at the top ("openai") or in "options" ("ollama")
SEEDED_PATHS = {
    "/v1/chat/completions": "openai",
    "/v1/completions": "openai",
    "/api/chat": "ollama",
    "/api/generate": "ollama",
}


def with_seed(
    path: str, body: bytes, draw: Callable[[int], int] = secrets.randbelow
) -> tuple[bytes, int | None]:
    """``body`` with a seed of its own where ``path`` generates and it names none, and that seed; else
    ``body`` unchanged and None."""
    where = SEEDED_PATHS.get(path)
    if where is None:
        return body, None
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body, None
    if not isinstance(request, dict):
        return body, None
    holder: Any = request
    if where == "ollama":
        holder = request.setdefault("options", {})
        if not isinstance(holder, dict):
            return body, None
    if holder.get("seed") is not None:
        return body, None
    seed = draw(SEED_BOUND)
    holder["seed"] = seed
    return json.dumps(request).encode(), seed


def with_length(headers: tuple[tuple[bytes, bytes], ...], body: bytes) -> tuple[tuple[bytes, bytes], ...]:
    """``headers`` with content-length set to ``body``'s length (the body was rewritten)."""
    kept = tuple((k, v) for k, v in headers if k.lower() != b"content-length")
    return (*kept, (b"content-length", str(len(body)).encode()))
