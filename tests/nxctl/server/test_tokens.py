"""Prompt truncation (Ollama's way) and token strings / bytes for logprobs."""

from __future__ import annotations

import pytest

from engine.loader import LoadedModel
from nxctl.server.tokens import chat_prompt_ids, fit_messages, token_bytes, token_text


@pytest.fixture(scope="module")
def tok(tiny_loaded: LoadedModel):
    return tiny_loaded.tokenizer


def test_fit_drops_oldest_turns_first_and_keeps_system_and_the_last(tok) -> None:
    system = {"role": "system", "content": "be brief"}
    old = [{"role": "user", "content": "old " * 80}, {"role": "assistant", "content": "older " * 80}]
    recent = [
        {"role": "user", "content": "recent question"},
        {"role": "assistant", "content": "recent answer"},
    ]
    last = {"role": "user", "content": "last"}
    wanted = chat_prompt_ids(tok, [system, *recent, last])
    ids, cut = fit_messages(tok, [system, *old, *recent, last], limit=len(wanted) + 5)
    assert cut and ids == wanted
    ids, cut = fit_messages(tok, [system, *recent, last], limit=10_000)
    assert not cut and ids == wanted


def test_fit_keeps_the_tail_when_even_the_last_message_is_too_long(tok) -> None:
    ids, cut = fit_messages(tok, [{"role": "user", "content": "z " * 500}], limit=50)
    full = chat_prompt_ids(tok, [{"role": "user", "content": "z " * 500}])
    assert cut and ids == full[-50:]


def test_token_bytes_reassemble_the_text(tok) -> None:
    text = "héllo wörld, ünïcode ✓"
    ids = tok.encode(text)
    assert b"".join(token_bytes(tok, t) for t in ids).decode("utf-8") == text
    assert all(isinstance(token_text(tok, t), str) for t in ids)
    assert (
        token_bytes(tok, tok.stop_token_ids[0])
        == tok.decode([tok.stop_token_ids[0]], skip_special_tokens=False).encode()
    )
