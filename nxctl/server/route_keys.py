"""What the seat's router knows of a request: its model and the hash chain of its prompt's token blocks.

    body of POST /v1/chat/completions {"model": "tiny", "messages": [...]}
        -> the model's served name (the registry resolves aliases), the messages rendered with its chat
           template and tokenized (its tokenizer only: no weights), cut into blocks of the model's
           ``block_size`` tokens -> RouteKey("tiny", (h1, h2, ...)), h_i = hash(h_{i-1}, block i)

The same idea as the engine's prefix cache (a block's hash names its whole prefix and its model, so two
prompts to one model share the first k hashes exactly when they share their first k full blocks, barring
a hash collision, which costs a cache miss, never a wrong answer); a partial last block has none.
It is a hint, computed once in the ingress: a body the replica will refuse (bad JSON, an unknown model,
a prompt that does not render) gets a key with what could be read, and the replica answers the error.
Ollama's /api/generate is keyed by its prompt as given (its template and system are applied on the
replica), /v1/responses by its input text or its messages.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import NxError
from engine.loader import ChatTokenizer, load_tokenizer
from engine.mux.registry import Registry

# the field that holds each generating path's prompt
PROMPT_FIELDS = {
    "/v1/chat/completions": "messages",
    "/api/chat": "messages",
    "/v1/completions": "prompt",
    "/api/generate": "prompt",
    "/v1/responses": "input",
}


@dataclass(frozen=True)
class RouteKey:
    """A request as the router sees it. ``model``: its served name (None: not named, or unknown);
    ``blocks``: the hash chain of its prompt's full token blocks; ``replica``: a replica it must go to
    (the ingress asking every replica for its /metrics), None for the router's choice; ``roster``: a
    list the router fills with the ids of the replicas it routes to (the router runs in the caller's
    process and sees the call's own arguments: a handle offers no other way to ask it), then any
    replica takes the call."""

    model: str | None = None
    blocks: tuple[int, ...] = ()
    replica: str | None = None
    roster: list[str] | None = field(default=None, compare=False)


def block_hashes(ids: Sequence[int], block_size: int, model: str = "") -> tuple[int, ...]:
    """The hash chain of ``ids``' full blocks of ``block_size`` tokens, begun from ``model``'s name
    (a prefix cache is one model's: the same tokens under another model share nothing). Computed and
    compared in one process, the ingress's."""
    chain: list[int] = []
    previous = hash(model)
    for start in range(0, len(ids) - block_size + 1, block_size):
        previous = hash((previous, tuple(ids[start : start + block_size])))
        chain.append(previous)
    return tuple(chain)


class RouteKeys:
    """Route keys of request bodies, with each model's tokenizer read once, when first needed."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._tokenizers: dict[str, ChatTokenizer] = {}

    def key(self, path: str, body: bytes) -> RouteKey:
        """The key of a request to ``path`` with ``body`` (no key for paths that do not generate)."""
        field = PROMPT_FIELDS.get(path)
        if field is None:
            return RouteKey()
        try:
            request = json.loads(body)
        except ValueError:
            return RouteKey()
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            return RouteKey()
        try:
            spec = self.registry.resolve(request["model"])
        except NxError:
            return RouteKey()
        if spec.source is None:
            return RouteKey(spec.name)
        try:
            ids = self._prompt_ids(spec.name, spec.source, request.get(field))
        except Exception:  # noqa: BLE001 - a prompt the router cannot read is routed by model alone
            ids = []
        return RouteKey(spec.name, block_hashes(ids, spec.engine.block_size, spec.name))

    def _tokenizer(self, name: str, source: str) -> ChatTokenizer:
        if name not in self._tokenizers:
            self._tokenizers[name] = load_tokenizer(source)[1]
        return self._tokenizers[name]

    def _prompt_ids(self, name: str, source: str, prompt: Any) -> list[int]:
        """The prompt's token ids as the replica will see them (near enough for routing)."""
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        tokenizer = self._tokenizer(name, source)
        if isinstance(prompt, str):
            return tokenizer.encode_prompt(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            messages = [_plain_message(m) for m in prompt]
            return tokenizer.encode_chat(messages, add_generation_prompt=True)
        return []


def _plain_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message with its content as text (OpenAI's content parts joined)."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        content = "".join(p for p in parts if isinstance(p, str))
    return {"role": str(message.get("role", "user")), "content": content if isinstance(content, str) else ""}
