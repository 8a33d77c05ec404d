"""Text holding the characters ``str.splitlines`` breaks at though JSON leaves them raw (NEL, U+2028,
U+2029) streams whole: every SSE event and NDJSON line the seat writes stays one line to a reader that
splits like ``httpx``'s ``iter_lines`` (the official ``ollama`` client's), and the text arrives unchanged.
A grammar makes `tiny` (random weights) write exactly such a text."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from nxctl.server.wire_json import LINE_BREAKING, compact_json

TEXT = "a\u2028b\x85c\u2029d"  # no regex metacharacter: as a regex, it matches itself alone


@pytest.mark.parametrize("char", sorted(LINE_BREAKING))
def test_compact_json_escapes_each_line_breaking_character_and_reads_back_the_same(char: str) -> None:
    payload = {"content": f"x{char}y", "other": "é"}
    text = compact_json(payload)
    assert len(text.splitlines()) == 1 and "é" in text
    assert json.loads(text) == payload


def test_openai_stream_events_stay_one_line_each_to_iter_lines(seat) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "separators"}],
        "max_tokens": 40,
        "stream": True,
        "structured_outputs": {"regex": TEXT},
    }
    with httpx.stream("POST", seat.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == TEXT


def test_the_ollama_client_streams_the_text_whole(seat) -> None:
    client = ollama.Client(host=seat.url)
    parts = client.chat(
        model="tiny",
        messages=[{"role": "user", "content": "separators"}],
        format={"type": "string", "enum": [TEXT]},
        stream=True,
        options={"num_predict": 40},
    )
    assert json.loads("".join(p.message.content for p in parts)) == TEXT
