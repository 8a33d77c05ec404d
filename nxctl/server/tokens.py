"""Prompts as token ids (chat template, text or ids checked against the vocabulary), Ollama's truncation,
and token strings for logprobs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import cache
from typing import Any

from engine.loader import ChatTokenizer
from engine.structured.tools import Tool
from nxctl.server.api_errors import bad_request
from nxctl.server.host import SeatModel

Message = dict[str, Any]


def chat_prompt_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message],
    tools: Sequence[Tool] | None = None,
    thinking: bool | None = None,
) -> list[int]:
    """The messages (and tools) rendered with the model's chat template, ready for the assistant's
    turn (``thinking``: a reasoning model's switch, None for its default)."""
    return tokenizer.encode_chat(list(messages), add_generation_prompt=True, tools=tools, thinking=thinking)


async def prompt_ids(model: SeatModel, item: str | list[int], what: str, param: str) -> list[int]:
    """A text (encoded off the event loop) or a list of token ids, checked: not empty, in the vocabulary."""
    ids = (
        await asyncio.to_thread(model.tokenizer.encode_prompt, item) if isinstance(item, str) else list(item)
    )
    if not ids:
        raise bad_request(f"{what} encodes to no tokens", param=param)
    check_ids(ids, model.llm.model_config.vocab_size)
    return ids


def check_ids(ids: list[int], vocab_size: int) -> None:
    """400 when a token id is outside the model's vocabulary."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token ids must be in [0, {vocab_size}); got {bad[0]}", param="prompt")


def fit_messages(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message],
    limit: int,
    tools: Sequence[Tool] | None = None,
    thinking: bool | None = None,
) -> tuple[list[int], bool]:
    """Ollama's truncation: drop the oldest turns (system messages kept, the last message always kept)
    until the rendered prompt has at most ``limit`` tokens; if even that is too long, keep the prompt's
    last ``limit`` tokens. Returns (token ids, whether anything was cut)."""
    kept = list(messages)
    ids = chat_prompt_ids(tokenizer, kept, tools, thinking)
    cut = False
    while len(ids) > limit:
        droppable = [i for i, m in enumerate(kept[:-1]) if m.get("role") != "system"]
        if not droppable:
            return ids[-limit:], True
        del kept[droppable[0]]
        cut = True
        ids = chat_prompt_ids(tokenizer, kept, tools, thinking)
    return ids, cut


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable stand-in of each byte -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, codes, strict=True)}


def token_bytes(tokenizer: ChatTokenizer, token_id: int) -> bytes:
    """The raw bytes of one token (byte-level BPE pieces mapped back to bytes; special tokens as UTF-8)."""
    piece = tokenizer.tokenizer.id_to_token(int(token_id))
    if piece is None:
        return b""
    table = _byte_decoder()
    if (
        all(ch in table for ch in piece)
        and tokenizer.token_to_id(piece) == token_id
        and not _is_special(tokenizer, token_id)
    ):
        return bytes(table[ch] for ch in piece)
    return tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")


def _is_special(tokenizer: ChatTokenizer, token_id: int) -> bool:
    return token_id in tokenizer.stop_token_ids or tokenizer.decode([token_id]) == ""


def token_text(tokenizer: ChatTokenizer, token_id: int) -> str:
    """A token as text for logprobs: its bytes decoded, invalid UTF-8 shown as ``\\xNN`` escapes."""
    return token_bytes(tokenizer, token_id).decode("utf-8", errors="backslashreplace")
